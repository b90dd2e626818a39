"""`posprobe attention` (SPEC §10): run a model on texts through the capture layer (`posprobe.capture`: batches,
the recording attention function checked against eager attention on the first batch), reduce its attention with
`posprobe.analysis.empirical.EmpiricalAccumulator`, and set the weights-based profiles beside the result.

The result type and its files are in `attention_result.py`; reading texts in `posprobe.texts.reading` (both re-exported
here, as are the recording attention's name and registration).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import fields, replace
from typing import Any

import numpy as np

from posprobe.analysis.empirical import EmpiricalAccumulator, correlation_with_weights
from posprobe.analysis.learned_sinks import LearnedSinkAccumulator
from posprobe.analysis.sinks import SinkAccumulator
from posprobe.capture import RECORD_NAME, check_model, register_recording_attention
from posprobe.capture.memory import check_fits
from posprobe.capture.model import attention_layers, layer_kind_words, picks_keys_per_head, run_stack
from posprobe.capture.textrun import TextModel, run_texts, text_run
from posprobe.edits import describe, parse_edits
from posprobe.errors import ArgumentValueError, PosprobeError
from posprobe.pipelines.attention_result import AttentionResult, write_attention
from posprobe.pipelines.defaults import ATTENTION_MIN_PAIRS
from posprobe.texts.reading import check_texts, iter_texts, parse_hub_texts
from posprobe.validation import as_bool, as_choice, as_int

MAX_ACCUMULATOR_BYTES = 16 * 2**30
WEIGHTS_MATRIX_BYTES = 64 * 2**20  # one layer's H x n² float64 weights-based scores: longer n read fewer positions
MEAN_SCORES_AUTO_BYTES = 2**29  # mean_scores None keeps the n x n sums (M, count matrix) when they take at most this


def attention_profiles(
    model: Any = None,
    texts: Iterable[str] | None = None,
    *,
    input_ids: Iterable[list[int]] | None = None,
    special_ids: Iterable[int] | None = None,
    max_length: int | None = None,
    max_texts: int | None = None,
    batch_size: int = 32,
    exclude_special: bool = False,
    device: str | None = None,
    allow_pickle: bool = False,
    max_memory: dict | str | None = None,
    weights_correlation: bool = True,
    min_pairs: int = ATTENTION_MIN_PAIRS,
    verify: bool = True,
    progress: Callable[[int], None] | None = None,
    text_source: str | None = None,
    stack: str = "encoder",
    mean_scores: bool | None = None,
    block_size: int | None = None,
    taps: Any = None,
    edits: Any = None,
) -> AttentionResult:
    """Empirical score/probability profiles, mean attention distance and mean score matrix (SPEC §10), and the
    attention-sink measures (SPEC §14: first-token and special-token mass, sink rate, distance without the first
    token, uniform-attention references), every layer and head, in one pass over the texts.

    model: hub id, folder, None (packaged MiniLM) or a loaded transformers model. texts: strings, tokenised
    with the model's tokenizer (special tokens added as it does) and truncated to `max_length` (default 128, or
    the model's positions if fewer); or `input_ids`: pre-tokenised sequences (no tokenizer needed; `special_ids`
    says which ids are special). Pairs are counted between real tokens that the model's mask lets attend
    (j <= i in causal models); `exclude_special` drops special tokens as queries and keys (for the sink masses:
    as queries; the first token and special tokens are what they measure). `weights_correlation`: correlate s(k)
    with the weights-based profile, over the offsets with at least `min_pairs` pairs. `verify` checks on
    the first batch that the recorded attention reproduces the model's own (`posprobe.capture`). `progress(k)` is
    called after each batch with the number of texts it held. An encoder-decoder (T5, BART, ...) runs its encoder
    stack on the texts (`stack` 'encoder', the default; 'decoder' is refused: its self-attention needs a target
    text and reads the encoder's output); one whose encoder reads no text (Whisper: audio) runs its decoder, without
    encoder states, whichever `stack` is given. A hybrid (Jamba, LFM2, Qwen3-Next, ...) has its attention layers
    recorded; its other layers (recurrent / state-space / convolution) have no attention: NaN in every per-layer
    array (no pair, no query), and `layer_kinds` says so.
    `mean_scores`: keep the n x n sums of the mean score matrix M (and the count matrix and M's Toeplitz R^2): True
    (refused in one line where they do not fit), False (memory linear in n), None (the default): kept when they take
    at most 512 MiB (L x (H + 1) x n² x 8 bytes; e.g. n <= 3344 for 2 layers x 2 heads, n <= 472 for 30 x 9), else
    not. Without them `mean_scores`, `count_matrix` and `toeplitz_r2` are None (no array, null in JSON).
    `block_size`: query rows per block of the blockwise route (SPEC §19, `capture.capture_batches`): None (the
    default) computes in blocks the batches whose whole matrices would take 256 MiB or more, 0 never, a positive
    number every batch. `taps`: taps on the attention kernel (`posprobe.kernel.Taps`: a head zeroed, keys masked,
    ...) applied in every forward pass before the attention is recorded (a family outside AttentionInterface is
    refused). `edits`: the user's edits (SPEC §20: strings such as 'attend:4,60', or parsed), checked against the
    config before any weight is read, applied in every forward pass before the attention is recorded; recorded in
    the result's `edits`.
    """
    run = text_run(texts, input_ids, special_ids=special_ids, max_length=max_length, max_texts=max_texts,
                   batch_size=batch_size, exclude_special=exclude_special, device=device, max_memory=max_memory,
                   progress=progress, text_source=text_source, block_size=block_size)  # fmt: skip
    if mean_scores is not None:
        mean_scores = as_bool(mean_scores, "mean_scores")
    min_pairs = as_int(min_pairs, "min_pairs", minimum=1)
    stack = as_choice(stack, "stack", ("encoder", "decoder"))
    started = time.perf_counter()

    def check(net) -> tuple[int, int]:
        if stack == "decoder" and run_stack(net) != "decoder":
            kind = getattr(net.config, "model_type", "unknown")
            raise ArgumentValueError(
                "stack",
                f"{{arg}} decoder: posprobe attention runs the encoder stack of the encoder-decoder '{kind}' on the "
                "texts (its decoder's self-attention needs a target text and reads the encoder's output)"
                if getattr(net.config, "is_encoder_decoder", False)
                else f"{{arg}} decoder: '{kind}' has one stack, no decoder",
                "drop {arg}",
            )
        return check_model(net, encoder_decoder=True, hybrid=True)

    def reducers(loaded: TextModel) -> list:
        (n_layers, n_heads), n = loaded.checked, loaded.max_length
        n_acc = len(attention_layers(loaded.net, n_layers))  # a hybrid's attention layers; every layer otherwise
        per_head = picks_keys_per_head(loaded.net)  # MiniMax M3: counts per head too
        square = _square_bytes(n_acc, n_heads, n, per_head)
        keep = square <= MEAN_SCORES_AUTO_BYTES if mean_scores is None else mean_scores
        need = EmpiricalAccumulator.nbytes(n_acc, n_heads, n, mean_scores=keep, head_masks=per_head)
        if need > MAX_ACCUMULATOR_BYTES:
            raise PosprobeError(
                f"max_length {n} needs {need / 2**30:.1f} GiB of accumulators for the mean score matrix ({n_acc} "
                f"attention layers x {n_heads} heads x n² float64)",
                "leave out the mean score matrix (--mean-scores no), or use a smaller --max-length",
            )
        what = f"the accumulators of max_length {n}" + (
            f" ({n_acc} attention layers x {n_heads} heads x n² float64, the mean score matrix)" if keep else ""
        )
        hint = "leave out the mean score matrix (--mean-scores no), or use a smaller --max-length"
        check_fits(need, loaded.device, what, hint if keep else "use a smaller --max-length")
        made = [
            EmpiricalAccumulator(n_acc, n_heads, n, loaded.device, mean_scores=keep, head_masks=per_head),
            SinkAccumulator(n_acc, n_heads, loaded.device, head_masks=per_head),
        ]
        if has_learned_sinks(loaded.net):
            made.append(LearnedSinkAccumulator(n_acc, n_heads, loaded.device))
        return made

    output = run_texts(model, run, reducers, check=check, allow_pickle=allow_pickle, verify=verify, taps=taps,
                       edits=edits)  # fmt: skip
    source, net, max_length = output.model.source, output.model.net, output.model.max_length
    n_layers, n_heads = output.model.checked
    acc, sinks, *learned = output.reducers
    learned = learned[0] if learned else None
    summary = output.summary
    n_texts = summary.n_texts
    attending = list(output.summary.attention_layers)  # a hybrid's attention layers; every layer otherwise
    kinds = layer_kind_words(net, max_length)  # read from the config
    profiles, sink_measures = acc.result(), sinks.result()
    shares = None if learned is None else learned.result()
    if len(attending) < n_layers:  # a hybrid: its other layers get NaN rows (no pair, no query: counts 0)
        profiles, sink_measures, shares = (
            every_layer(part, attending, n_layers) for part in (profiles, sink_measures, shares)
        )
    w_profiles, w_corr, note = (None, None, "not requested")
    if weights_correlation:
        w_profiles, note = _weights_profiles(source, max_length, n_layers, n_heads)
        if w_profiles is not None:
            w_corr = correlation_with_weights(profiles, w_profiles, min_pairs)
    return AttentionResult(
        source.name if source is not None else type(net).__name__,
        str(getattr(net.config, "model_type", "unknown")),
        n_texts,
        max_length,
        run.exclude_special,
        n_layers,
        n_heads,
        profiles,
        w_profiles,
        w_corr,
        note,
        time.perf_counter() - started,
        text_source,
        sinks=sink_measures,
        learned_sinks=shares,
        min_pairs=min_pairs,
        quantization=None if source is None else source.quantization,
        stack=run_stack(net),
        layer_kinds=kinds,
        edits=describe(parse_edits(edits)),
        mean_scores_note="kept"
        if profiles.mean_scores is not None
        else _not_kept(mean_scores, _square_bytes(len(attending), n_heads, max_length, picks_keys_per_head(net))),
    )


def _square_bytes(n_layers: int, n_heads: int, n: int, head_masks: bool = False) -> int:
    """Bytes of the accumulators' n x n sums (the mean score matrix and its counts), kept or not (`mean_scores`)."""
    full = EmpiricalAccumulator.nbytes(n_layers, n_heads, n, head_masks=head_masks)
    return full - EmpiricalAccumulator.nbytes(n_layers, n_heads, n, mean_scores=False, head_masks=head_masks)


def _not_kept(asked: bool | None, square: int) -> str:
    """Why the n x n sums were not kept (the JSON's `mean_scores`)."""
    if asked is False:
        return "not kept (mean_scores=False): no mean_scores, count_matrix or toeplitz_r2"
    return (
        f"not kept: the n x n sums would take {square / 2**30:.1f} GiB (more than "
        f"{MEAN_SCORES_AUTO_BYTES // 2**20} MiB); pass mean_scores=True (--mean-scores yes) to keep them"
    )


# the per-layer fields (leading axis L) of EmpiricalProfiles, SinkMeasures and LearnedSinkShares
_PER_LAYER = frozenset({
    "score_profiles", "prob_profiles", "pair_counts", "mean_distance", "mean_scores", "count_matrix", "toeplitz_r2",
    "n_queries", "prob_profiles_without_first", "pair_counts_without_first", "first_token_mass",
    "special_token_mass", "distance_without_first", "sink_rate", "uniform_distance", "uniform_distance_without_first",
    "uniform_first_token_mass", "first_token_queries", "learned_sink_share", "real_token_share", "head_pair_counts",
})  # fmt: skip
_COUNTS = frozenset({"pair_counts", "count_matrix", "n_queries", "pair_counts_without_first", "first_token_queries",
                     "head_pair_counts"})  # fmt: skip


def every_layer(part, attending: list[int], n_layers: int):
    """`part` (EmpiricalProfiles, SinkMeasures, LearnedSinkShares or None) of the attention layers `attending`
    (leading axis A) spread over all `n_layers` layers: row a goes to layer attending[a]; the other layers (a
    hybrid's recurrent / convolution ones) hold NaN, or 0 in counts (no pair, no query)."""
    if part is None:
        return None
    changes = {}
    for f in fields(part):
        value = getattr(part, f.name)
        if f.name not in _PER_LAYER or value is None or np.ndim(value) == 0:  # SinkMeasures.n_queries: a count
            continue
        value = np.asarray(value)
        fill = 0 if f.name in _COUNTS or np.issubdtype(value.dtype, np.integer) else np.nan
        out = np.full((n_layers, *value.shape[1:]), fill, dtype=value.dtype)
        out[attending] = value
        changes[f.name] = out
    return replace(part, **changes)


def has_learned_sinks(net) -> bool:
    """True when the model's family gives its heads learned sink logits (`Family.sinks`: gpt-oss)."""
    from posprobe.families import family_for_type

    family = family_for_type(str(getattr(net.config, "model_type", "")))
    return family is not None and family.sinks is not None


def weights_positions(n: int, n_heads: int) -> int:
    """Positions the weights-based profile is read over: n, or fewer where one layer's H x n x n float64 score
    matrices would take more than `WEIGHTS_MATRIX_BYTES` (memory then stays flat however long the texts)."""
    return max(2, min(n, math.isqrt(WEIGHTS_MATRIX_BYTES // (8 * max(1, n_heads)))))


def _weights_profiles(source, n: int, n_layers: int, n_heads: int) -> tuple[np.ndarray | None, str]:
    """Faithful-mode F̂_P profiles (L, H, 2n-1) over the leading positions, or None and why not: one model reader
    over n' = `weights_positions(n, H)` positions (the weights read once), each layer's scores reduced to their
    diagonal means; with n' < n the offsets |k| >= n' are NaN (the correlation uses the offsets both profiles have);
    the layers past the reader's (a pooled model's past its first block) NaN."""
    if source is None:
        return None, "unavailable: model passed as an object (no checkpoint to read weights from)"
    from posprobe.analysis.empirical import centre_offsets
    from posprobe.analysis.toeplitz import diagonal_means
    from posprobe.pipelines.score_reader import ScoreReader, open_model

    positions = weights_positions(n, n_heads)
    try:
        reader = ScoreReader(open_model(source=source, mode="faithful"), positions=positions)
        rows = [diagonal_means(reader.scores(layer)) for layer in range(min(n_layers, reader.n_layers))]
    except PosprobeError as err:
        return None, f"unavailable: {err.message}"
    what = "faithful-mode F̂_P (SPEC §3)" if reader.mode == "faithful" else "content-free scores (SPEC §9)"
    # layers past those the reader has (Funnel's later blocks and upsampling decoder, `capture.pooled`): NaN
    profiles = np.stack(rows + [np.full_like(rows[0], np.nan)] * (n_layers - len(rows)))
    if positions == n:
        return profiles, f"{what} diagonal means over positions 0..n-1"
    import torch

    wide = centre_offsets(torch.from_numpy(profiles), n).numpy()
    wide[..., : n - positions] = np.nan
    wide[..., n + positions - 1 :] = np.nan
    return wide, (
        f"{what} diagonal means over positions 0..{positions - 1} (offsets |k| < {positions}; over all {n} "
        f"positions each layer's score matrices would take {8 * n_heads * n * n / 2**30:.1f} GiB)"
    )


__all__ = [
    "RECORD_NAME",
    "AttentionResult",
    "attention_profiles",
    "check_texts",
    "iter_texts",
    "parse_hub_texts",
    "register_recording_attention",
    "write_attention",
]
