"""`posprobe context` (SPEC §17): loss by position across long windows, perplexity per length, per rotary scaling
variant, with the rotary budget.

Cheap checks come first (arguments, the config: a causal family, variants only for rotary embeddings, lengths
within a learned table), then the texts are tokenized (only as many documents as the windows need), then the
model is loaded once and run on the run loop (`capture.loop.run`, with `edits` on the attention kernel where
given): for each variant, for each length, windows in batches, one step each; each step's logits are reduced to
float64 losses per position (`token_nll`), in blocks of positions where they would not fit at once
(`capture.logit_blocks`), and added into float64 sums with counts per position (`WindowLoss`), so no logits are
kept; a batch that cannot fit even so is refused before the model is loaded. Under torchrun (SPEC §19) the steps
are shared out by rank (step k, counted over every variant and length, is rank k % world's) and the sums and counts
are all-reduced by the loop after each length's last step, so every rank returns the result of all windows.

The result type is in `context_result.py`; the pure computations in `posprobe.analysis.context_loss`; the
variants in `posprobe.families.rope_variants`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from os import PathLike
from typing import Any

import numpy as np

from posprobe.analysis.context_loss import (
    PositionLoss,
    common_targets,
    cut_windows,
    perplexity_interval,
    rotary_budget,
    target_mask,
    windows_available,
)
from posprobe.architectures import table as T
from posprobe.edits import describe, prepare_edits
from posprobe.errors import ArgumentTypeError, ArgumentValueError, PosprobeError
from posprobe.families import rope_variants as R
from posprobe.kernel import Taps
from posprobe.pipelines.context_result import ContextResult
from posprobe.pipelines.defaults import CONTEXT_BATCH_SIZE, CONTEXT_LENGTHS, CONTEXT_WINDOWS, ROPE_SCALING
from posprobe.validation import as_int


class WindowLoss(PositionLoss):
    """The step reducer of one (variant, length): each step's per-token losses (B, L-1) added into float64 sums and
    counts per position, over the positions `masks` (windows, L-1) bool marks for each window (None: every one), a
    step whose scored losses are not finite refused; added over torchrun ranks."""

    needs = ("loss",)
    rank_sums = ("sums", "counts", "windows", "window_sums", "window_counts")
    rank_kept = ("masks",)  # the same on every rank: which positions of each window are scored

    def __init__(self, length: int, variant: str, masks: np.ndarray | None = None):
        super().__init__(length)
        self.variant, self.masks = variant, masks
        # each window's summed loss and tokens scored (the perplexity's interval over windows), with masks only
        self.window_sums = np.zeros(0 if masks is None else len(masks), dtype=np.float64)
        self.window_counts = np.zeros(0 if masks is None else len(masks), dtype=np.int64)

    def add_output(self, out) -> None:
        start = out.step.meta
        mask = None if self.masks is None else self.masks[start : start + len(out.loss)]
        _check_finite(out.loss if mask is None else np.where(mask, out.loss, 0.0), self.variant, self.length, start)
        self.add(out.loss, mask)
        if mask is not None:
            rows = slice(start, start + len(out.loss))
            self.window_sums[rows] += np.where(mask, np.asarray(out.loss, dtype=np.float64), 0.0).sum(-1)
            self.window_counts[rows] += mask.sum(-1)


def check_lengths(lengths: Sequence[int] | str | None) -> list[int]:
    """Window lengths, each >= 2, sorted, duplicates dropped (default `CONTEXT_LENGTHS`)."""
    if lengths is None:
        return list(CONTEXT_LENGTHS)
    if isinstance(lengths, str):
        parts = [x.strip() for x in lengths.split(",") if x.strip()]
        try:
            lengths = [int(x) for x in parts]
        except ValueError as err:
            raise ArgumentValueError("lengths", f"{{arg}} '{','.join(parts)}' is not a list of whole numbers",
                                     "e.g. --lengths 512,1024,2048") from err  # fmt: skip
    if isinstance(lengths, int) or not isinstance(lengths, Iterable):
        raise ArgumentTypeError("lengths", "{arg} must be a list of window lengths", "e.g. [512, 1024]")
    values = sorted({as_int(x, "lengths", minimum=2) for x in lengths})
    if not values:
        raise ArgumentValueError("lengths", "{arg} names no length", "e.g. --lengths 512,1024,2048")
    return values


def check_family(source, variants: list[R.RopeVariant], lengths: list[int]) -> str:
    """The position kind of a causal model posprobe reads; refused in one line: a family that is not a causal
    language model, a variant for a model without rotary embeddings, a length past a learned position table."""
    family = T.family_for_type(source.model_type)
    kind, mechanism = T.position_kind(source.config)
    causal = family is not None and T.is_causal(family, T.language_model_config(source.config))
    if not causal or source.config.get("is_encoder_decoder"):
        raise PosprobeError(
            f"'{source.name}' ({source.model_type}) is not a causal language model posprobe reads: loss by position "
            "needs next-token predictions",
            "pass a decoder such as SmolLM2-135M-Instruct, a Llama/Qwen/Gemma folder or a .gguf file",
        )
    scaled = [v.name for v in variants if v.rope_type is not None]
    if scaled and kind != T.ROTARY:
        raise ArgumentValueError(
            "rope_scaling",
            f"{{arg}} {', '.join(scaled)}: '{source.name}' uses {mechanism}, not rotary embeddings, so there is no "
            "rope to scale",
            "use {arg} none",
        )
    limit = source.config.get("max_position_embeddings") or source.config.get("n_positions")
    if kind in T.TABLE_KINDS and isinstance(limit, int) and lengths[-1] > limit:
        raise ArgumentValueError(
            "lengths",
            f"{{arg}} {lengths[-1]}: '{source.name}' has a learned table of {limit} positions and cannot run beyond it",
            f"use lengths of at most {limit}",
        )
    return kind


def bos_of(tokenizer) -> int | None:
    """The BOS id when the tokenizer puts one first in an encoded text (SPEC §17), else None."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    ids = tokenizer("a")["input_ids"]
    return bos if ids and ids[0] == bos else None


def token_stream(documents: Iterable, needed: int, encode: Callable | None, eos_id: int | None) -> tuple[list, int]:
    """(stream, documents used): documents (texts encoded with `encode`, or token id lists) joined with `eos_id`
    between consecutive ones, read only until the stream holds `needed` tokens."""
    stream: list[int] = []
    used = 0
    for document in documents:
        ids = list(encode(document)) if encode is not None else [int(x) for x in document]
        if not ids:
            continue
        if stream and eos_id is not None:
            stream.append(int(eos_id))
        stream.extend(ids)
        used += 1
        if len(stream) >= needed:
            break
    return stream, used


def context(
    model: str | PathLike | Any = None,
    lengths: Sequence[int] | str | None = None,
    *,
    texts: Iterable[str] | None = None,
    documents: Iterable[Sequence[int]] | None = None,
    windows: int = CONTEXT_WINDOWS,
    rope_scaling: str | Sequence[str] = ROPE_SCALING,
    batch_size: int = CONTEXT_BATCH_SIZE,
    device: str | None = None,
    bos_id: int | None = None,
    eos_id: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    allow_pickle: bool = False,
    source=None,
    max_memory: dict | str | None = None,
    taps: Taps | None = None,
    edits: Iterable[str] | str | None = None,
) -> ContextResult:
    """Loss by position and perplexity per length for each rotary variant (SPEC §17).

    model: hub id, folder, .gguf file, packaged name, or a loaded causal LM (transformers `...ForCausalLM`; then
    pass `documents`, token id lists, and optionally `bos_id`; `eos_id` defaults to its config's). texts: strings
    tokenized with the model's tokenizer (its BOS and EOS found there). lengths: window lengths in tokens
    (default 512, 1024, 2048); windows: windows per length; rope_scaling: 'none,linear:2,dynamic:2,yarn:4,
    llama3:8' or a list; batch_size: windows per forward pass; progress(done, total) after each forward pass
    (under torchrun: every rank's passes counted); device: cpu, cuda, ... or 'auto' (accelerate's big-model
    inference, with `max_memory` per device, e.g. {'cpu': '8GiB'}: past it, layers go to disk). taps: taps on the
    attention kernel applied in every forward pass (`posprobe.kernel.Taps`; None: the model as it is). edits: the
    user's edits (SPEC §20: strings such as 'head:3.1=mean', 'attend:4,60', or parsed `posprobe.edits` objects),
    checked against the config before any weight is read and applied in every forward pass; `=mean` edits run each
    (variant, length)'s windows once more, before, without edits, for their means.
    `windows` windows of the longest length cover C = windows x (L_max - b) stream tokens (b = 1 with a BOS, else
    0); every length's perplexity is over exactly the same tokens of them (`common_targets`: all C with a BOS; without
    one, all but those that start a window at some length, which no window there predicts), each length in
    ceil(C / (L - b)) windows (a last window reaching past C scores only its part before it), so perplexities differ
    by context alone (lengths need not divide each other). `tokens` holds that count per length; the loss by
    position is over every position of the longest length's windows.
    """
    from posprobe.capture.loop import Step, run
    from posprobe.capture.model import capture_device, dispatch_settings, place_on
    from posprobe.capture.textrun import check_run_settings

    lengths = check_lengths(lengths)
    windows = as_int(windows, "windows", minimum=1)
    _, _, batch_size, max_memory = check_run_settings(batch_size=batch_size, device=device, max_memory=max_memory)
    variants = R.parse_variants(rope_scaling)
    if (texts is None) == (documents is None):
        raise ArgumentValueError("texts", "pass exactly one of {arg} (strings) and documents (token ids)",
                                 "e.g. context('SmolLM2-135M-Instruct', texts=open('book.txt'))")  # fmt: skip
    net, tokenizer, source = _open(model, texts is not None, allow_pickle, source)
    kind = check_family(source, variants, lengths)
    edits = prepare_edits(edits, source.config, source.name, lengths[-1])
    if tokenizer is not None:
        bos_id = bos_of(tokenizer)
        eos_id = getattr(tokenizer, "eos_token_id", None)
        encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    else:
        eos_id = eos_id if eos_id is not None else _config_eos(source.config)
        encode = None
    with_bos = bos_id is not None
    covered = windows * (lengths[-1] - with_bos)  # the stream tokens the longest length's windows hold
    counts = [-(-covered // (n - with_bos)) for n in lengths]  # windows per length: each covers them all
    needed = max(count * (n - with_bos) for count, n in zip(counts, lengths))
    stream, used = token_stream(texts if texts is not None else documents, needed, encode, eos_id)
    _check_enough(stream, used, lengths, windows, with_bos)
    _check_memory(source, batch_size, lengths[-1], device)
    common = common_targets(covered, lengths, with_bos)  # (C,) the tokens every length scores
    # past C no token is scored, and a causal model's loss at t never reads later tokens: where the text ends
    # before the last window of a shorter length does, that window is filled out with EOS (or 0)
    read = len(stream)
    stream = list(stream) + [eos_id if eos_id is not None else 0] * max(0, needed - read)
    if net is None:
        net = _load(source, allow_pickle, dispatch_settings(device, max_memory))
    dev = capture_device(net, device)
    net = place_on(net, dev).eval()
    if any(v.rope_type for v in variants):
        R.require_rotary_module(net, source.name)
    config = _text_config(net)
    rotary = kind == T.ROTARY and bool(R.rotary_modules(net))
    key = R.variant_key(config) if rotary else None
    total = len(variants) * sum(-(-count // batch_size) for count in counts)
    index = 0  # step number over every variant and length: step k is rank k % world's under torchrun
    all_sums, curves, inv_freq, scaling = [], [], [], []
    for variant in variants:
        with R.applied(net, variant) as modules:
            for length, count in zip(lengths, counts):
                # the common tokens (the perplexity), and at the longest length every position (loss(t))
                sums = WindowLoss(length, variant.name, target_mask(common, length, count, with_bos))
                reducers = [sums] + ([WindowLoss(length, variant.name)] if length == lengths[-1] else [])
                batches = cut_windows(stream, length, count, bos_id)
                steps = (
                    Step(batches[start : start + batch_size], kwargs={"use_cache": False}, meta=start)
                    for start in range(0, count, batch_size)
                )
                index = run(net, steps, reducers, taps, edits=edits, start=index, total=total, progress=progress)
                all_sums.append(sums)
                curves += reducers[1:]
            if rotary:
                freq, scale = R.inv_freq_of(modules[0], key)
                inv_freq.append(freq.detach().double().cpu().numpy())
                scaling.append(scale)
    if progress is not None:
        progress(total, total)  # the last rounds may have run on other ranks
    per_variant = [all_sums[v * len(lengths) : (v + 1) * len(lengths)] for v in range(len(variants))]
    position_loss = [curve.mean for curve in curves]  # the longest length's loss by position
    perplexity = [[sums.perplexity for sums in row] for row in per_variant]
    intervals = [[perplexity_interval(sums.window_sums, sums.window_counts) for sums in row] for row in per_variant]
    trained = R.trained_length(config, rotary)
    budget = None
    if rotary:
        freqs = dict(zip((v.name for v in variants), inv_freq))
        budget = rotary_budget(2 * len(inv_freq[0]), R.base_parameters(config)["rope_theta"], trained, freqs)
    return ContextResult(
        model=source.name,
        model_type=source.model_type,
        position_kind=kind,
        variants=[v.name for v in variants],
        lengths=lengths,
        position_loss=np.stack(position_loss),
        perplexity=np.asarray(perplexity, dtype=np.float64),
        perplexity_interval=np.asarray(intervals, dtype=np.float64),
        inv_freq=np.stack(inv_freq) if rotary else np.zeros((len(variants), 0)),
        attention_scaling=np.asarray(scaling if rotary else [1.0] * len(variants), dtype=np.float64),
        windows=np.asarray(counts, dtype=np.int64),
        tokens=np.asarray([sums.scored for sums in per_variant[0]], dtype=np.int64),
        trained_length=trained,
        max_positions=R.max_positions(config),
        text={
            "documents_used": used,
            "stream_tokens": read,
            "bos_id": bos_id,
            "eos_id": eos_id,
            "scored_stream_tokens": covered,
            "window_starts_left_out": int(covered - common.sum()),
        },  # fmt: skip
        budget=budget,
        quantization=source.quantization,
        edits=describe(edits),
    )


def _open(model, need_tokenizer: bool, allow_pickle: bool, source):
    """(loaded model or None, tokenizer or None, ModelSource); nothing heavier than the config and the tokenizer
    is read for a checkpoint (its weights are loaded after the texts are checked)."""
    from torch import nn

    from posprobe.checkpoint import resolve_model
    from posprobe.checkpoint.in_memory import source_from_model

    if isinstance(model, nn.Module):
        if need_tokenizer:
            raise ArgumentValueError("texts", "a model object carries no tokenizer", "pass documents (token ids)")
        if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
            raise PosprobeError(f"'{type(model).__name__}' has no language-model head",
                                "pass a ...ForCausalLM model (AutoModelForCausalLM)")  # fmt: skip
        from posprobe.capture.model import language_model_alone

        alone = language_model_alone(model)  # a wrapper whose forward fails on text (Llama 4): its causal LM
        if alone.get_output_embeddings() is not None:
            model = alone
        return model, None, source_from_model(model)
    if source is None:
        source = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=True)
    tokenizer = None
    if need_tokenizer:
        from posprobe.checkpoint.loading import load_tokenizer

        tokenizer = load_tokenizer(source.path, "use a model folder that holds its tokenizer files")
    return None, tokenizer, source


def _load(source, allow_pickle: bool, dispatch: dict):
    """The causal LM of `source`; `dispatch`: `dispatch_settings`' keywords (accelerate's device map) or {}."""
    from transformers import AutoModelForCausalLM

    from posprobe.retrofitting.loading import load_model

    return load_model(source, AutoModelForCausalLM, allow_pickle=allow_pickle, **dispatch)  # resolved once already


def _check_finite(nll: np.ndarray, variant: str, length: int, start: int) -> None:
    """Refuse a batch whose losses hold NaN or infinity (a broken or overflowing model): a perplexity would be NaN."""
    bad = ~np.isfinite(nll).all(axis=1)
    if bad.any():
        window = start + int(np.argmax(bad))
        raise PosprobeError(
            f"the model gives NaN or infinite losses on window {window} of {length} tokens (variant {variant}): its "
            "logits overflow or it holds NaN",
            "check the checkpoint (its weights and dtype), or use another model",
        )


def _check_memory(source, batch_size: int, length: int, device) -> None:
    """Refuse, before the model is loaded, a batch of windows whose logits block and activations
    (`capture.logit_blocks.context_batch_bytes`) pass the free memory of `device` (not checked for 'auto': accelerate
    places the layers)."""
    if device == "auto":
        return
    from posprobe.capture.logit_blocks import context_batch_bytes
    from posprobe.capture.memory import check_fits
    from posprobe.capture.model import resolve_device

    need = context_batch_bytes(T.language_model_config(source.config), batch_size, length)
    what = f"a batch of {batch_size} window(s) of {length} tokens does not fit in memory"
    hint = "use a smaller --batch-size" if batch_size > 1 else "use shorter --lengths"
    check_fits(need, resolve_device(device), what, hint)


def _text_config(net):
    config = net.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _config_eos(config: dict) -> int | None:
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos if isinstance(eos, int) else None


def _check_enough(stream: list, used: int, lengths: list[int], windows: int, with_bos: bool) -> None:
    """Refuse, before the model is loaded, a text too short for `windows` windows of every length."""
    longest = lengths[-1]
    available = windows_available(len(stream), longest, with_bos)
    if available >= windows:
        return
    fits = [n for n in lengths if windows_available(len(stream), n, with_bos) >= windows]
    hint = f"pass --windows {available}" if available else "pass a longer text"
    if fits and not available:
        hint = f"use --lengths up to {fits[-1]}, or a longer text"
    raise ArgumentValueError(
        "windows",
        f"the text gives {len(stream):,} tokens ({used} document{'s' if used != 1 else ''}), {available} window(s) of "
        f"{longest} tokens, and {{arg={windows}}} were asked for",
        hint,
    )
