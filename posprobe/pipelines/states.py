"""`posprobe states` (SPEC §16): run a model on texts once through the capture layer (`posprobe.capture`, hidden
states only, so every encoder or decoder transformers runs with `output_hidden_states` works) and reduce its
hidden states with three reducers at once: positional vectors (`analysis.positional_vectors`), position probes
(`analysis.position_probe`) and massive activations (`analysis.massive`). Memory is set by their sums (see
`accumulator_bytes`), never by the number of texts.

The result type and its files are in `states_result.py`; a series of checkpoints in `states_series.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from posprobe.analysis.massive import MassiveActivationAccumulator, is_delimiter
from posprobe.analysis.position_probe import PositionProbeAccumulator, baseline_inputs
from posprobe.analysis.positional_vectors import (
    NULL_DRAWS,
    PermutedPositionAccumulator,
    PositionalVectorAccumulator,
)
from posprobe.capture import check_model
from posprobe.capture.model import layer_kind_words, text_config
from posprobe.capture.textrun import TextModel, run_texts, text_run
from posprobe.edits import describe, parse_edits
from posprobe.errors import ArgumentValueError, PosprobeError
from posprobe.pipelines.defaults import MIN_TEXTS, STATES_CONTROLS, STATES_MAE_SAMPLE, STATES_NULL_DRAWS, STATES_SEED
from posprobe.pipelines.states_result import StatesResult
from posprobe.runtime.phases import phase
from posprobe.validation import as_int, as_int_list

MAX_ACCUMULATOR_BYTES = 16 * 2**30


class _CheckStates:
    """Refuses a model whose `output_hidden_states` is not L+1 tensors of (B, m, d) (the first batch tells)."""

    needs = ("hidden_states",)
    rank_sums = ()  # keeps nothing

    def __init__(self, n_states: int, hidden_size: int, kind: str):
        self.n_states, self.hidden_size, self.kind = n_states, hidden_size, kind

    def add(self, batch) -> None:
        hidden = batch.hidden_states
        shapes = {tuple(h.shape) for h in hidden}
        expected = (*batch.input_ids.shape, self.hidden_size)
        if len(hidden) != self.n_states or shapes != {expected}:
            raise PosprobeError(
                f"'{self.kind}' returned {len(hidden)} hidden states of shapes {sorted(shapes)}; expected "
                f"{self.n_states} of {expected}",
                "this model's hidden states are not laid out as one per layer plus the embedding output",
            )

    def result(self) -> None:
        return None


def accumulator_bytes(
    n_states: int, n_positions: int, hidden_size: int, probe_layers: int, sample: int, null_draws: int = NULL_DRAWS
) -> int:
    """Bytes of the reducers' state: positional sums (and their permutation null's), probe statistics and sample,
    massive-activation histograms."""
    return (
        PositionalVectorAccumulator.nbytes(n_states, n_positions, hidden_size)
        + PermutedPositionAccumulator.nbytes(null_draws, n_states, n_positions, hidden_size)
        + PositionProbeAccumulator.nbytes(probe_layers, hidden_size, sample)
        + MassiveActivationAccumulator.nbytes(n_states)
    )


def states(
    model: Any = None,
    texts: Iterable[str] | None = None,
    *,
    input_ids: Iterable[Sequence[int]] | None = None,
    special_ids: Iterable[int] | None = None,
    max_length: int | None = None,
    max_texts: int | None = None,
    batch_size: int = 32,
    min_texts: int = MIN_TEXTS,
    probe_layers: Sequence[int] | None = None,
    mae_sample: int = STATES_MAE_SAMPLE,
    seed: int = STATES_SEED,
    null_draws: int = STATES_NULL_DRAWS,
    controls: int = STATES_CONTROLS,
    device: str | None = None,
    allow_pickle: bool = False,
    revision: str | None = None,
    max_memory: dict | str | None = None,
    progress: Callable[[int], None] | None = None,
    text_source: str | None = None,
    edits: Any = None,
) -> StatesResult:
    """Position in the hidden states of `model` on `texts` (SPEC §16), every hidden state l = 0..L in one pass:
    positional vectors (positions with at least `min_texts` texts) and their Gram matrix's Toeplitz R², position
    probes (5-fold ridge by text, held-out R² and MAE, and the control on positions permuted within each text),
    and massive activations (largest |activation|, where, its ratio to the median, the top tokens).

    model: hub id (`revision`: a branch, tag or commit), folder, None (packaged MiniLM) or a loaded transformers
    model. texts: strings, tokenised by the model's tokenizer (special tokens added as it does), truncated to
    `max_length` (default 128, or the model's positions if fewer); or `input_ids` (pre-tokenised; `special_ids`
    marks special tokens). `probe_layers`: the hidden states to probe (default all; -1 is the last), each costing
    5·d² float64 of memory; `mae_sample`: tokens the MAE is measured on (reservoir sample; all when fewer);
    `seed`: the control permutations', the null's and the sample's seed; `controls`: control permutation draws
    (mean and spread reported); `null_draws`: permutation-null draws of the positional Gram R² (0: none; each
    costs the positional sums' memory again). The probe's baseline (no hidden state: the first-token flag, plus the
    text length where the model attends both ways; `is_causal`) comes with every run. `progress(k)` is called after
    each batch with the number of texts it held. `edits`: the user's edits (SPEC §20: strings such as
    'channel:3.123=mean', or parsed), checked against the config before any weight is read, applied in every pass;
    recorded in the result's `edits`.
    """
    run = text_run(texts, input_ids, special_ids=special_ids, max_length=max_length, max_texts=max_texts,
                   batch_size=batch_size, device=device, max_memory=max_memory, progress=progress,
                   text_source=text_source)  # fmt: skip
    min_texts = as_int(min_texts, "min_texts", minimum=1)
    mae_sample = as_int(mae_sample, "mae_sample", minimum=1, maximum=2**24)
    seed = as_int(seed, "seed", minimum=0)
    null_draws = as_int(null_draws, "null_draws", minimum=0, maximum=1000)
    controls = as_int(controls, "controls", minimum=1, maximum=100)
    started = time.perf_counter()
    name = None
    if revision is not None:
        from posprobe.checkpoint import resolve_model

        resolved = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=True, revision=revision)
        model, name = resolved, resolved.name

    def check(net) -> tuple[int, str, int]:
        n_layers, _ = check_model(net, attention=False)
        kind = str(getattr(net.config, "model_type", "unknown"))
        hidden_size = getattr(text_config(net), "hidden_size", None)
        if not isinstance(hidden_size, int) or hidden_size < 1:
            raise PosprobeError(f"cannot read the hidden size of '{kind}' from its config", "use a standard config")
        return n_layers, kind, hidden_size

    def reducers(loaded: TextModel) -> list:
        (n_layers, kind, hidden_size), n, device = loaded.checked, loaded.max_length, loaded.device
        n_states = n_layers + 1
        layers = _probe_layers(probe_layers, n_states)
        need = accumulator_bytes(n_states, n, hidden_size, len(layers), mae_sample, null_draws)
        if need > MAX_ACCUMULATOR_BYTES:
            raise PosprobeError(
                f"the probes of {len(layers)} hidden states of size {hidden_size} and {null_draws} null draws need "
                f"{need / 2**30:.1f} GiB of accumulators (5 folds x d² float64 per probe, (L+1)·n·d per draw)",
                "probe fewer hidden states with --probe-layers (e.g. --probe-layers 0,8,16) or lower --null-draws",
            )
        return [
            _CheckStates(n_states, hidden_size, kind),
            PositionalVectorAccumulator(n_states, n, hidden_size, device),
            PermutedPositionAccumulator(n_states, n, hidden_size, device, draws=null_draws, seed=seed),
            PositionProbeAccumulator(n_states, layers, hidden_size, device, sample=mae_sample, seed=seed,
                                     controls=controls, baseline=baseline_inputs(is_causal(loaded.net))),
            MassiveActivationAccumulator(n_states, device),
        ]  # fmt: skip

    output = run_texts(model, run, reducers, check=check, allow_pickle=allow_pickle, edits=edits)
    source, net, tokenizer, max_length = (
        output.model.source,
        output.model.net,
        output.model.tokenizer,
        output.model.max_length,
    )
    n_layers, kind, hidden_size = output.model.checked
    kinds = layer_kind_words(net, max_length)  # read from the config
    _, vectors, null, probes, massive = output.reducers
    layers = probes.layers
    summary = output.summary
    massive_result = massive.result()
    tokens = delimiters = None
    if tokenizer is not None:
        ids = massive_result.top_token
        tokens = [[str(t) for t in tokenizer.convert_ids_to_tokens([int(x) for x in row])] for row in ids]
        delimiters = [[is_delimiter(t) for t in row] for row in tokens]
    if name is None:
        name = source.name if source is not None else type(net).__name__
    phase(f"fitting the position probes of {len(layers)} hidden states (5 folds; the permuted controls, the baseline)")
    probe_result = probes.result()
    null_r2, null_r2_without_first = null.result(min_texts)
    return StatesResult(
        model=name,
        model_type=kind,
        n_texts=summary.n_texts,
        max_length=max_length,
        n_layers=n_layers,
        hidden_size=hidden_size,
        vectors=vectors.result(min_texts),
        probes=probe_result,
        massive=massive_result,
        top_tokens=tokens,
        top_delimiter=delimiters,
        seconds=time.perf_counter() - started,
        text_source=text_source,
        revision=revision,
        quantization=None if source is None else source.quantization,
        null_r2=null_r2,
        null_r2_without_first=null_r2_without_first,
        layer_kinds=kinds,
        edits=describe(parse_edits(edits)),
    )


def is_causal(net) -> bool:
    """Whether the loaded model's position i sees only tokens 0..i: the family table's word (its config switches
    included: a Gemma 3 set to attend both ways is not causal); for a type the table lacks, its config's
    `is_decoder` or a `...ForCausalLM` class."""
    from posprobe.architectures import table as T

    config = net.config.to_dict() if hasattr(net.config, "to_dict") else dict(net.config)
    text = T.language_model_config(config)
    family = T.family_for_type(str(config.get("model_type"))) or T.family_for_type(str(text.get("model_type")))
    if family is not None:
        return T.is_causal(family, text)
    return bool(text.get("is_decoder")) or type(net).__name__.endswith("ForCausalLM")


def _probe_layers(value, n_states: int) -> list[int]:
    """The probed hidden states, sorted (None: all); -1 is the last."""
    if value is None:
        return list(range(n_states))
    layers = as_int_list(value, "probe_layers", hint="e.g. --probe-layers 0,4,8")
    wrong = [x for x in layers if not -n_states <= x < n_states]
    if wrong:
        raise ArgumentValueError(
            "probe_layers",
            f"hidden state {wrong[0]} does not exist (this model has 0..{n_states - 1}: the embedding output and "
            f"{n_states - 1} layers)",
            "pick from that range with {arg} (-1 is the last)",
        )
    return sorted({x % n_states for x in layers})
