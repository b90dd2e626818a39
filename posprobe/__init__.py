"""posprobe: measure, fit and retrofit positional mechanisms in pretrained transformers.

Every name in `__all__` is imported on first use, so `import posprobe` stays light (no torch, transformers or
matplotlib until an analysis or a model needs them):

- analyses of a model id, folder, None (the packaged all-MiniLM-L6-v2) or a loaded transformers model:
  `toeplitz` (P = E_P E_P^T and its Toeplitz R^2), `fhat` (F_hat_P per head of a layer), `profiles` (head
  profiles over k = j - i), `compare` (several models);
- on real text: `attention_profiles` (empirical profiles, mean attention distance and attention sinks,
  `AttentionResult`); `fhat` / `profiles` with `texts=` (data-conditioned scores); `states` (positional
  vectors, position probes and massive activations in the hidden states, `StatesResult`) and `states_series` (the
  same over training checkpoints, `StatesSeries`); `posprobe.capture` runs a model on text for any reducer
  (`text_run` describes a run over texts, checked once; `run_texts` runs it with a list of reducers);
- causal LMs: `needle` (retrieval by length and depth, `NeedleGrid`, `NeedleTask`, `NeedleResult`);
- rotary models: `rotary` (band norms of queries and keys per rotary frequency, `RotaryBandsResult`);
- causal LMs across long windows: `context` (loss by position, perplexity per length, rotary scaling variants,
  `ContextResult`);
- TISA kernels: `fit_tisa` (a model's heads, several S) and `TisaKernelFitter` (any profiles, scikit-learn style);
- models: `load_model`, `retrofit`, `save_retrofitted`, `finetune` / `evaluate` (GLUE, `FinetuneResult`);
- result types (each with a short repr, `.plot()`, `.to_dict()`, `.to_json()` and `.save(out_dir)`: the files the
  command writes, through the one save path `save(result, out_dir, fmt)`) and `PosprobeError`.
"""

from __future__ import annotations

import importlib
import importlib.util

from posprobe.version import __version__

# public name -> module that defines it (imported on first access)
_EXPORTS = {
    "toeplitz": "posprobe.pipelines.weights",
    "fhat": "posprobe.pipelines.weights",
    "profiles": "posprobe.pipelines.weights",
    "compare": "posprobe.pipelines.weights",
    "ToeplitzResult": "posprobe.pipelines.weights",
    "FhatResult": "posprobe.pipelines.weights",
    "ProfileResult": "posprobe.pipelines.weights",
    "CompareResult": "posprobe.pipelines.weights",
    "CompareRow": "posprobe.pipelines.weights",
    "attention_profiles": "posprobe.pipelines.attention",
    "AttentionResult": "posprobe.pipelines.attention_result",
    "rotary": "posprobe.pipelines.rotary",
    "RotaryBandsResult": "posprobe.pipelines.rotary_result",
    "context": "posprobe.pipelines.context",
    "ContextResult": "posprobe.pipelines.context_result",
    "states": "posprobe.pipelines.states",
    "StatesResult": "posprobe.pipelines.states_result",
    "states_series": "posprobe.pipelines.states_series",
    "StatesSeries": "posprobe.pipelines.states_series",
    "needle": "posprobe.pipelines.needle",
    "NeedleGrid": "posprobe.pipelines.needle",
    "NeedleTask": "posprobe.pipelines.needle_prompts",
    "NeedleResult": "posprobe.pipelines.needle_result",
    "fit_tisa": "posprobe.pipelines.fitting",
    "load_tisa_kernels": "posprobe.formats.tisa_kernels",
    "save_tisa_kernels": "posprobe.formats.tisa_kernels",
    "TisaFitResult": "posprobe.pipelines.fitting",
    "TisaFit": "posprobe.pipelines.fitting",
    "TisaKernelFitter": "posprobe.analysis.tisa_fit",
    "tisa_function": "posprobe.analysis.tisa_fit",
    "load_model": "posprobe.retrofitting.loading",
    "retrofit": "posprobe.retrofitting.install",
    "save_retrofitted": "posprobe.retrofitting.install",
    "finetune": "posprobe.glue",
    "evaluate": "posprobe.glue",
    "FinetuneConfig": "posprobe.glue",
    "FinetuneResult": "posprobe.glue",
    "save": "posprobe.formats.save",
    "text_run": "posprobe.capture.textrun",
    "run_texts": "posprobe.capture.textrun",
    "PosprobeError": "posprobe.errors",
    "ArgumentValueError": "posprobe.errors",
    "ArgumentTypeError": "posprobe.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")  # `posprobe.plotting` without an import (a notebook)
        raise AttributeError(f"module 'posprobe' has no attribute '{name}'")
    loaded = importlib.import_module(module)
    globals()[name] = getattr(loaded, name)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
