"""Model access: finding checkpoints and reading their files, nothing about what a family's tensors mean.

`resolve` turns a model argument (hub id, local folder, .gguf file, a packaged name, or nothing = the packaged
MiniLM) into a local checkpoint and checks its config (`config`); `safetensors_format` checks a safetensors header
as the format promises; `weights` reads single tensors lazily from safetensors (`open_weights` picks the reader of
any checkpoint); `gguf_format` checks a GGUF header, `gguf_source` gives a GGUF file's config and quantisation
through transformers' GGUF mapping, `gguf_weights` reads its tensors lazily, de-quantised, under transformers'
names; `in_memory` reads a loaded model's state dict the same way; `loading` builds a plain transformers model
with the checks around it (used by `posprobe.load_model` and `retrofit`). What the tensors mean (layouts, norms,
positions) is the model reader's job: `posprobe.families.context.ModelContext`.
"""

from posprobe.checkpoint.resolve import DEFAULT_MODEL_NAME, ModelSource, default_model_dir, resolve_model
from posprobe.checkpoint.weights import WeightReader

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ModelSource",
    "default_model_dir",
    "resolve_model",
    "WeightReader",
]

from posprobe.runtime.submodules import importer

__getattr__ = importer(__name__)  # submodules on first use, as in a notebook
