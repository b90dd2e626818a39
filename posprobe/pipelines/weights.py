"""Weight-only position analyses of a checkpoint (no text is run): P and its Toeplitz R^2, F_hat_P per head, head
profiles, comparisons.

Each analysis (`toeplitz`, `fhat`, `profiles`, `compare`) takes a model as a hub id, a local folder, None (the packaged
all-MiniLM-L6-v2) or a loaded transformers model object, reads only the tensors it needs (lazily from
safetensors for ids and folders, from `state_dict()` for objects; the same code either way) and returns a frozen
result with a short repr, `.plot()`, `.to_dict()` and `.to_json()`. Nothing is printed and nothing is written:
the CLI writes files. Arguments are checked here (posprobe.validation), with the library's argument names.
Reading the model: `score_reader.py`; the result classes: `weights_results.py` (both re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from os import PathLike
from typing import TYPE_CHECKING, Any

import numpy as np

from posprobe.analysis.fhat import MODES
from posprobe.analysis.position_products import position_inner_products
from posprobe.analysis.toeplitz import block_r2, diagonal_means, offsets, sections, toeplitz_r2
from posprobe.checkpoint import ModelSource
from posprobe.checkpoint.in_memory import is_model_object
from posprobe.errors import ArgumentError, ArgumentTypeError, ArgumentValueError
from posprobe.pipelines.data_conditioned import text_settings
from posprobe.pipelines.defaults import FHAT_LAYER, MIN_TEXTS, MODE
from posprobe.pipelines.score_reader import (
    DEFAULT_POSITIONS,
    MIN_POSITIONS,
    ScoreReader,
    _check_positions,
    _layer_index,
    open_model,
)
from posprobe.pipelines.weights_results import (
    CompareResult,
    CompareRow,
    FhatResult,
    ProfileResult,
    ToeplitzResult,
)
from posprobe.results import middle_ellipsis
from posprobe.validation import as_bool, as_choice, as_int, as_int_list

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DEFAULT_BLOCK = 128
DEFAULT_PROFILE_WINDOW = 20  # half-width of the profile summary and sections (the fit's own default is tisa_fit's)

__all__ = [
    "DEFAULT_BLOCK",
    "DEFAULT_POSITIONS",
    "DEFAULT_PROFILE_WINDOW",
    "MIN_POSITIONS",
    "CompareResult",
    "CompareRow",
    "FhatResult",
    "ProfileResult",
    "ScoreReader",
    "ToeplitzResult",
    "compare",
    "fhat",
    "open_model",
    "profiles",
    "profiles_from",
    "section_rows",
    "toeplitz",
]


def toeplitz(
    model: str | PathLike | PreTrainedModel | None = None,
    blocks: list[int] | None = None,
    cosine: bool = False,
    allow_pickle: bool = False,
    source: ModelSource | None = None,
) -> ToeplitzResult:
    """P = E_P E_P^T (n, n) of `model`'s position table and its Toeplitz R^2 (SPEC §1-2).

    model: hub id, folder, None (packaged MiniLM) or a loaded transformers model. blocks: sizes of leading
    blocks to score too (a list; None = [128], listed in `skipped_blocks` when the table is shorter).
    cosine: unit-normalise the rows first. allow_pickle: read `pytorch_model.bin` (only from a trusted source).
    """
    try:
        blocks = as_int_list(blocks, "blocks", minimum=1)
    except ArgumentError as err:
        err.flag = "--block"  # the CLI's repeatable option
        raise
    cosine = as_bool(cosine, "cosine")
    ctx = open_model(model, allow_pickle, source, table=True)
    source = ctx.source
    table = ctx.position_table
    n = table.n_positions
    _check_positions(n, source.name)
    if blocks is None:
        blocks, skipped = ([DEFAULT_BLOCK], ()) if n >= DEFAULT_BLOCK else ([], (DEFAULT_BLOCK,))
    else:
        skipped = ()
        for b in blocks:
            if b > n:
                raise ArgumentValueError(
                    "blocks",
                    f"block {b} does not fit '{source.name}', whose position table has {n} rows",
                    f"use {{arg}} between 1 and {n}",
                    flag="--block",
                )
        blocks = sorted(blocks)
    p = position_inner_products(table.table, cosine=cosine)
    return ToeplitzResult(
        source.name,
        source.model_type,
        n,
        table.dropped_rows,
        cosine,
        p,
        toeplitz_r2(p),
        {b: block_r2(p, b) for b in blocks},
        tuple(skipped),
        quantization=source.quantization,
    )


def _fhat_result(reader: ScoreReader, layer: int, conditioning: dict | None = None) -> FhatResult:
    """The `FhatResult` of model layer `layer` (0-based, already checked) read through `reader` (`conditioning`:
    the record of data-conditioned inputs, SPEC §13)."""
    f = reader.scores(layer)
    source = reader.source
    by_construction = reader.toeplitz_by_construction  # R^2 = 1 whatever the weights: nothing to measure
    r2 = np.full(f.shape[0], np.nan) if by_construction else np.asarray(toeplitz_r2(f), dtype=np.float64)
    return FhatResult(
        source.name,
        source.model_type,
        layer,
        reader.ctx.stored_layer(layer),
        reader.mode,
        f,
        r2,
        reader.kind,
        reader.causal,
        reader.reported_stack,
        by_construction,
        reader.layer_kind(layer),
        quantization=source.quantization,
        conditioning=conditioning,
        language_model=source.language_model,
    )


_TEXT_ARGUMENTS = """texts / input_ids (token id sequences; special_ids: which ids are special): condition the scores on
    real text (SPEC §13): layer l gets the mean hidden state entering it in place of the embedding-level input
    (mode 'data-conditioned'; `mode` does not apply). input: 'mean' (over texts and real tokens at positions >= 1)
    or 'position-mean' (per position, for positions with at least `min_texts` texts); None (default): position-mean
    for a model with an absolute position table (where 'mean' leaves every score of a head the same number), mean
    otherwise (`data_conditioned.default_input`). max_length (tokens per text), max_texts, batch_size, device,
    progress (called with the number of texts of each batch), max_memory (with device 'auto': memory per device,
    past it layers go to disk): the run on text, as for `attention_profiles`. edits: SPEC §20's edits (strings
    such as 'head:3.1', or parsed) applied in every pass over the texts; recorded in `conditioning['edits']`."""


def _conditioned(reader: ScoreReader, layers: list[int], settings, model, source, allow_pickle, positions):
    """(reader, conditioning record): `reader` itself without texts, else one fed the texts' mean hidden states."""
    if settings is None:
        return reader, None
    from posprobe.pipelines.data_conditioned import capture_target, condition_reader

    return condition_reader(reader, layers, settings, capture_target(model, source), allow_pickle, positions)


def fhat(
    model: str | PathLike | PreTrainedModel | None = None,
    layer: int = FHAT_LAYER,
    mode: str = MODE,
    allow_pickle: bool = False,
    source: ModelSource | None = None,
    positions: int | None = None,
    stack: str = "encoder",
    *,
    texts: Iterable[str] | None = None,
    input_ids: Iterable[list[int]] | None = None,
    special_ids: Iterable[int] | None = None,
    input: str | None = None,
    min_texts: int = MIN_TEXTS,
    max_length: int | None = None,
    max_texts: int | None = None,
    batch_size: int = 32,
    device: str | None = None,
    progress: Callable[[int], None] | None = None,
    max_memory: dict | str | None = None,
    edits: Any = None,
) -> FhatResult:
    """F_hat_P (H, n, n) for every head of `layer` (SPEC §3, §9) and each head's Toeplitz R^2.

    model: hub id, folder, None (packaged MiniLM) or a loaded transformers model. layer: 0-based, -1 = last.
    mode: 'paper' (position terms only) or 'faithful' (the real layer input for the average word); families
    without a learned table always give the content-free scores of SPEC §9 (mode 'content-free').
    positions: n analysed (default: the whole learned table, else min(the model's maximum, 512)).
    stack: 'encoder' or 'decoder' (encoder-decoder models).
    {texts}
    """
    mode = as_choice(mode, "mode", MODES)
    as_int(layer, "layer")
    settings = text_settings(texts, input_ids, special_ids, input, min_texts, max_length, max_texts, batch_size,
                             device, progress, max_memory=max_memory, edits=edits)  # fmt: skip
    reader = ScoreReader(open_model(model, allow_pickle, source, mode), positions, stack)
    layer = _layer_index(layer, reader.n_layers, reader.source.name)
    reader, conditioning = _conditioned(reader, [layer], settings, model, source, allow_pickle, positions)
    return _fhat_result(reader, layer, conditioning)


def profiles(
    model: str | PathLike | PreTrainedModel | None = None,
    layers: list[int] | str | None = None,
    mode: str = MODE,
    allow_pickle: bool = False,
    window: int | None = None,
    source: ModelSource | None = None,
    positions: int | None = None,
    stack: str = "encoder",
    *,
    texts: Iterable[str] | None = None,
    input_ids: Iterable[list[int]] | None = None,
    special_ids: Iterable[int] | None = None,
    input: str | None = None,
    min_texts: int = MIN_TEXTS,
    max_length: int | None = None,
    max_texts: int | None = None,
    batch_size: int = 32,
    device: str | None = None,
    progress: Callable[[int], None] | None = None,
    max_memory: dict | str | None = None,
    edits: Any = None,
) -> ProfileResult:
    """Profiles (diagonal means of F_hat_P over k = j - i) of every head of `layers`, plus 5 sections each.

    layers: a list of layer indices (-1 = last), or None / 'all' for every layer. window: half-width w of the
    sections and of the summary in `to_dict()` (1 <= w <= n - 1; None: DEFAULT_PROFILE_WINDOW, at most n - 1).
    mode: 'paper' or 'faithful' (learned tables; other families give SPEC §9 content-free scores). positions: n
    analysed (default: the whole learned table, else min(the model's maximum, 512)). stack: 'encoder' or 'decoder'
    (encoder-decoder models).
    {texts}
    """
    mode = as_choice(mode, "mode", MODES)
    if not (isinstance(layers, str) and layers == "all"):
        layers = as_int_list(layers, "layers")
    window = None if window is None else as_int(window, "window", minimum=1)
    settings = text_settings(texts, input_ids, special_ids, input, min_texts, max_length, max_texts, batch_size,
                             device, progress, max_memory=max_memory, edits=edits)  # fmt: skip
    reader = ScoreReader(open_model(model, allow_pickle, source, mode), positions, stack)
    layers = _layer_list(layers, reader)
    reader, conditioning = _conditioned(reader, layers, settings, model, source, allow_pickle, positions)
    return profiles_from(reader, layers, window, conditioning)


def _layer_list(layers: list[int] | str | None, reader: ScoreReader) -> list[int]:
    """Checked, distinct, non-negative layer indices of `layers` (-1 = last; None / 'all': every layer)."""
    if layers is None or layers == "all":
        return list(range(reader.n_layers))
    return list(dict.fromkeys(_layer_index(x, reader.n_layers, reader.source.name, "layers") for x in layers))


def profiles_from(
    reader: ScoreReader, layers: list[int] | str | None, window: int | None = None, conditioning: dict | None = None
) -> ProfileResult:
    """`profiles` of the model `reader` reads (its positions, stack, mode and any data-conditioned inputs already
    chosen; `conditioning` their record): `layers` a checked list of indices (-1 = last) or None / 'all';
    `window` a whole number >= 1 or None (the default)."""
    source = reader.source
    n_layers = reader.n_layers
    layers = _layer_list(layers, reader)
    n = reader.n
    if window is None:
        window = min(DEFAULT_PROFILE_WINDOW, n - 1)
    if window > n - 1:
        raise ArgumentValueError(
            "window", f"window {window} does not fit {n} positions", f"use {{arg}} between 1 and {n - 1}"
        )
    rows = section_rows(n, window)
    shared = reader.family.shared_layers
    profiles_, r2s, secs, cache, sink_shares = [], [], [], {}, []
    for layer in layers:
        stored = 0 if shared and conditioning is None else layer  # data-conditioned: each depth its own input
        if stored not in cache:
            res = _fhat_result(reader, layer)
            cache[stored] = (diagonal_means(res.matrices), res.toeplitz_r2, sections(res.matrices, rows, window))
            if reader.family.sinks:  # learned sinks (gpt-oss): the sink's share under these scores
                sink_shares.append(_content_free_sink_share(reader, layer, res.matrices))
        p, r, s = cache[stored]
        profiles_.append(p), r2s.append(r), secs.append(s)
    return ProfileResult(
        source.name,
        source.model_type,
        reader.mode,
        layers,
        offsets(n),
        np.stack(profiles_),
        np.stack(r2s),
        window,
        rows,
        np.stack(secs),
        n,
        reader.n_heads,
        n_layers,
        shared,
        position_kind=reader.kind,
        causal=reader.causal,
        stack=reader.reported_stack,
        toeplitz_by_construction=reader.toeplitz_by_construction,
        layer_kinds=[reader.layer_kind(layer) for layer in layers],
        quantization=source.quantization,
        conditioning=conditioning,
        learned_sink_share=np.stack(sink_shares) if sink_shares else None,
        language_model=source.language_model,
    )


def _content_free_sink_share(reader: ScoreReader, layer: int, matrices: np.ndarray) -> np.ndarray:
    """(H,) the learned sink's mean share over the n queries under the layer's F̂ and its mask (SPEC §9)."""
    from posprobe.analysis.learned_sinks import content_free_sink_share

    ctx = reader.ctx
    k = np.arange(reader.n)[None, :] - np.arange(reader.n)[:, None]
    allowed = ctx.layer_kinds(reader.n, reader.stack)[layer].allowed(reader.n) & ((k <= 0) if reader.causal else True)
    if "sink_projection" in reader.family.tensors:  # input-conditioned sinks (Inkling 2): of the content-free input
        from posprobe.families.relative_logits import sink_logits

        return content_free_sink_share(matrices, sink_logits(ctx, layer, reader.stack), allowed).mean(-1)
    logits = ctx.optional(reader.family.sinks, ctx.stored_layer(layer), reader.stack)
    if logits is None:  # a layer without sinks (MiMo-V2-Flash's global layers): the sink takes nothing
        return np.zeros(matrices.shape[0])
    if "pooled_keys" in reader.family.tensors:  # DeepSeek V4: pooled entries share the softmax, not in F̂ (SPEC §9)
        from posprobe.families.shared_kv import pooled_entries

        if pooled_entries(ctx, layer, reader.n):
            return np.full(matrices.shape[0], np.nan)
    return content_free_sink_share(matrices, logits, allowed).mean(-1)


fhat.__doc__ = fhat.__doc__.format(texts=_TEXT_ARGUMENTS)
profiles.__doc__ = profiles.__doc__.format(texts=_TEXT_ARGUMENTS)


def section_rows(n: int, window: int, count: int = 5) -> list[int]:
    """`count` query rows spread over the table, each with a full window -w..w of keys where possible."""
    lo, hi = (window, n - 1 - window) if n - 1 - window >= window else (0, n - 1)
    return sorted({int(round(x)) for x in np.linspace(lo, hi, count)})


def compare(
    models: list[str | PathLike | PreTrainedModel | None],
    mode: str = MODE,
    cosine: bool = False,
    allow_pickle: bool = False,
    positions: int | None = None,
) -> CompareResult:
    """One row per model (a list of two or more ids, folders or loaded models): positions, R^2 of P (whole and
    first 128; None for families without a learned table), mean per-head F_hat_P R^2 of layer 0 (content-free
    scores for families without a table). positions: n analysed per model (default as for `fhat`)."""
    if isinstance(models, (str, bytes, PathLike)) or is_model_object(models) or not hasattr(models, "__iter__"):
        raise ArgumentTypeError(
            "models", f"{{arg}} must be a list of models, got {type(models).__name__}", "e.g. compare([m1, m2])"
        )
    models = list(models)
    if len(models) < 2:
        raise ArgumentValueError(
            "models", f"compare needs two or more models, got {len(models)}", "add models", flag="MODELS"
        )
    mode = as_choice(mode, "mode", MODES)
    cosine = as_bool(cosine, "cosine")
    rows = []
    opened = [open_model(model, allow_pickle, mode=mode) for model in models]
    labels = [ctx.source.label for ctx in opened]
    clashes = {label for label in labels if labels.count(label) > 1}
    for ctx, label in zip(opened, labels):
        source = ctx.source
        label = middle_ellipsis(source.name, 40) if label in clashes else label
        reader = ScoreReader(ctx, positions)
        f = _fhat_result(reader, 0)
        has_table = ctx.has_table  # also a table beside a relative bias: MPNet
        if has_table:
            table = ctx.position_table.table[: reader.n]
            p = position_inner_products(table, cosine=cosine)
            first = block_r2(p, DEFAULT_BLOCK) if reader.n >= DEFAULT_BLOCK else None
            whole = toeplitz_r2(p)
        else:
            p, first, whole = f.matrices.mean(axis=0), None, None
        rows.append(
            CompareRow(
                source.name,
                label,
                reader.n,
                whole,
                first,
                f.mean_toeplitz_r2,
                p,
                reader.kind,
                reader.causal,
                reader.mode,
                has_table,
                f.toeplitz_by_construction,
                source.quantization,
            )  # fmt: skip
        )
    return CompareResult(mode, cosine, tuple(rows))
