"""One run of a model over texts: its description (`TextRun`, checked once by `text_run`) and the one function that
runs a model over it with a list of reducers (`run_texts`: read the model -> check it -> resolve the max length ->
device -> capture). `attention`, `states`, `rotary --text` and `profiles` / `fhat --text` are each a set of reducers
run by `run_texts`; the bounds of every setting are written here once. Under torchrun the capture shards the
batches over the ranks (`capture.run.capture_batches`, SPEC §19).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from posprobe.capture.batches import id_tokenizer, text_tokenizer, token_batches
from posprobe.capture.model import (
    capture_device,
    check_length,
    check_max_memory,
    dispatch_settings,
    embedding_rows,
    load_for_capture,
    model_device,
    pad_token_id,
    place_on,
    reads_padding,
    resolve_max_length,
    stack_to_run,
)
from posprobe.capture.run import CaptureSummary, Reducer, capture_batches
from posprobe.errors import ArgumentValueError, PosprobeError
from posprobe.validation import as_bool, as_int

DEFAULT_BATCH_SIZE = 32
MAX_BATCH_SIZE = 65536  # texts per forward pass
MIN_MAX_LENGTH = 2  # tokens per text for an analysis over positions: at least one offset k = j - i != 0
ANY_MAX_LENGTH = 1  # tokens per text for a bare capture (`capture`), which measures no offset


@dataclass(frozen=True)
class TextRun:
    """A checked run over texts (built by `text_run`): `texts` (strings, tokenised by the model's tokenizer,
    special tokens added as it does) or `input_ids` (token id sequences; `special_ids` says which ids are special),
    at most `max_texts` of them, each truncated to `max_length` tokens (None: 128, or the model's positions if
    fewer), in batches of `batch_size`; `exclude_special` leaves special tokens out of the counted ones; `device`
    (None: cuda when available; 'auto': accelerate's big-model inference, with `max_memory` per device, parsed);
    `progress(k)` is called after each batch of k texts; `text_source` says what the texts are, for the record;
    `block_size`: query rows per block of the blockwise route (`capture_batches`: None where whole matrices would
    be large, 0 never, a positive number every batch)."""

    texts: Iterable[str] | None
    input_ids: Iterable[Sequence[int]] | None
    special_ids: tuple[int, ...] = ()
    max_length: int | None = None
    max_texts: int | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    exclude_special: bool = False
    device: str | None = None
    max_memory: dict | None = None
    progress: Callable[[int], None] | None = None
    text_source: str | None = None
    block_size: int | None = None

    @property
    def needs_tokenizer(self) -> bool:
        return self.texts is not None


def check_run_settings(
    max_length: int | None = None,
    max_texts: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    *,
    min_length: int = MIN_MAX_LENGTH,
    device: str | None = None,
    max_memory: Any = None,
) -> tuple[int | None, int | None, int, dict | None]:
    """(max_length, max_texts, batch_size, max_memory) checked: the bounds of a run's numbers, in one place. Used
    by `text_run` and by the CLI before any model is read. `max_memory` applies only with `device` 'auto'."""
    if max_length is not None:
        max_length = as_int(max_length, "max_length", minimum=min_length)
    batch_size = as_int(batch_size, "batch_size", minimum=1, maximum=MAX_BATCH_SIZE)
    if max_texts is not None:
        max_texts = as_int(max_texts, "max_texts", minimum=1)
    max_memory = check_max_memory(device, max_memory)
    return max_length, max_texts, batch_size, max_memory


def text_run(
    texts: Iterable[str] | None = None,
    input_ids: Iterable[Sequence[int]] | None = None,
    *,
    special_ids: Iterable[int] | None = None,
    max_length: int | None = None,
    max_texts: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    exclude_special: bool = False,
    device: str | None = None,
    max_memory: Any = None,
    progress: Callable[[int], None] | None = None,
    text_source: str | None = None,
    min_length: int = MIN_MAX_LENGTH,
    block_size: int | None = None,
) -> TextRun:
    """The `TextRun` of these settings, every one checked here once: `max_length` of at least `min_length`
    (`MIN_MAX_LENGTH` for an analysis over offsets, `ANY_MAX_LENGTH` for a bare capture), `batch_size` within
    1..`MAX_BATCH_SIZE`, exactly one of `texts` and `input_ids` (texts an iterable of strings, not one string)."""
    max_length, max_texts, batch_size, max_memory = check_run_settings(
        max_length, max_texts, batch_size, min_length=min_length, device=device, max_memory=max_memory
    )
    exclude_special = as_bool(exclude_special, "exclude_special")
    if block_size is not None:
        block_size = as_int(block_size, "block_size", minimum=0)
    if isinstance(texts, (str, bytes)):
        raise ArgumentValueError(
            "texts", "{arg} must be an iterable of strings, got one string", "e.g. texts=['a text', 'another text']"
        )
    if (texts is None) == (input_ids is None):
        raise PosprobeError("pass exactly one of texts and input_ids", "texts for strings, input_ids if tokenised")
    return TextRun(texts, input_ids, tuple(special_ids or ()), max_length, max_texts, batch_size, exclude_special,
                   device, max_memory, progress, text_source, block_size)  # fmt: skip


@dataclass(frozen=True)
class TextModel:
    """The model a run reads: its `source` (None for a model object), the loaded `net` (on `device` once the run
    starts), its `tokenizer` (None for token ids), the resolved `max_length`, the `device` inputs and sums go to,
    and what the caller's `check` returned."""

    source: Any
    net: Any
    tokenizer: Any
    max_length: int
    device: Any
    checked: Any = None


@dataclass(frozen=True)
class TextRunOutput:
    """What `run_texts` ran: the model, the reducers (fed every batch) and the capture's summary."""

    model: TextModel
    reducers: list
    summary: CaptureSummary


def run_texts(
    model: Any,
    run: TextRun,
    reducers: Callable[[TextModel], Sequence[Reducer]],
    *,
    check: Callable[[Any], Any] | None = None,
    allow_pickle: bool = False,
    verify: bool = True,
    taps: Any = None,
    edits: Any = None,
) -> TextRunOutput:
    """Run `model` (hub id, folder, None for the packaged MiniLM, or a loaded model) once over `run`'s texts: read it
    (eager attention; accelerate's device map for device 'auto'), `check(net)` (the caller's refusals, before
    anything else; its value is kept as `checked`), resolve the max length, pick the device, build the reducers
    (`reducers(TextModel)`: where sums are sized and memory checked), move the model there and capture (with
    `taps` on the attention kernel in every forward pass: `capture_batches`). `edits`: the user's edits (SPEC §20:
    strings or parsed), checked against the config before any weight is read, applied in every forward pass."""
    dispatch = dispatch_settings(run.device, run.max_memory)  # device 'auto': accelerate's big-model inference
    if edits:
        model, edits = _checked_edits(model, edits, allow_pickle, run.max_length)
    source, net, tokenizer = load_for_capture(
        model, allow_pickle, need_tokenizer=run.needs_tokenizer, dispatch=dispatch
    )
    checked = check(net) if check is not None else None
    max_length = resolve_max_length(net, run.max_length)
    device = capture_device(net, run.device)
    loaded = TextModel(source, net, tokenizer, max_length, device, checked)
    made = list(reducers(loaded))
    net = place_on(net, device)
    loaded = TextModel(source, net, tokenizer, max_length, device, checked)
    summary = capture_run(net, made, run, tokenizer=tokenizer, max_length=max_length, verify=verify, taps=taps,
                          edits=edits)  # fmt: skip
    return TextRunOutput(loaded, made, summary)


def _checked_edits(model, edits, allow_pickle: bool, max_length: int | None):
    """(the model, resolved to its `ModelSource` where it is a name: not resolved again; the edits parsed and
    checked against its config, before any weight is read)."""
    from torch import nn

    from posprobe.capture.model import DEFAULT_MAX_LENGTH
    from posprobe.edits import prepare_edits

    max_length = max_length or DEFAULT_MAX_LENGTH  # resolve_max_length's default (capped by a table: check_edits)
    if isinstance(model, nn.Module):
        config = model.config.to_dict()
        return model, prepare_edits(edits, config, str(config.get("_name_or_path") or "model"), max_length)
    from posprobe.checkpoint import resolve_model

    source = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=True)
    return source, prepare_edits(edits, source.config, source.name, max_length)


def capture_run(
    model,
    reducers: Sequence[Reducer],
    run: TextRun,
    *,
    tokenizer: Any = None,
    max_length: int,
    verify: bool = True,
    taps: Any = None,
    edits: Any = (),
) -> CaptureSummary:
    """Feed every batch of `run` (on a loaded `model`, truncated to `max_length`) to `reducers` (see
    `capture_batches`): padded batches of `run.batch_size`, length-sorted within chunks of 16 batches; one text a
    batch for a model whose outputs read padding (`model.reads_padding`)."""
    if any(set(r.needs) & {"scores", "probs"} for r in reducers):
        check_length(stack_to_run(model), max_length)  # at once, rather than at the first long batch
    if run.texts is not None:
        if tokenizer is None:
            raise PosprobeError("texts need a tokenizer", "pass tokenizer=, or input_ids instead of texts")
        items, tokenize = run.texts, text_tokenizer(tokenizer, max_length, embedding_rows(model))
    else:
        items, tokenize = run.input_ids, id_tokenizer(run.special_ids, max_length, embedding_rows(model))
    batches = token_batches(
        items,
        tokenize,
        batch_size=1 if reads_padding(model) else run.batch_size,
        pad_id=pad_token_id(model, tokenizer),
        exclude_special=run.exclude_special,
        max_texts=run.max_texts,
        device=model_device(model),
    )
    return capture_batches(model, batches, reducers, verify=verify, progress=run.progress, block_size=run.block_size,
                           taps=taps, edits=edits or ())  # fmt: skip


def capture(
    model,
    reducers: Sequence[Reducer],
    texts: Iterable[str] | None = None,
    *,
    tokenizer: Any = None,
    input_ids: Iterable[Sequence[int]] | None = None,
    special_ids: Iterable[int] = (),
    max_length: int,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_texts: int | None = None,
    exclude_special: bool = False,
    verify: bool = True,
    progress: Callable[[int], None] | None = None,
    block_size: int | None = None,
) -> CaptureSummary:
    """Run a loaded `model` on `texts` (strings, tokenised by `tokenizer`, special tokens added as it does) or on
    `input_ids` (token id sequences; `special_ids` says which ids are special), truncated to `max_length`, in
    padded batches of `batch_size` (length-sorted within chunks of 16 batches), at most `max_texts` texts; feed
    every batch to `reducers` (see `capture_batches`, also for `block_size`). `exclude_special` leaves special tokens
    out of `counted`."""
    max_length = as_int(max_length, "max_length", minimum=ANY_MAX_LENGTH)
    run = text_run(texts, input_ids, special_ids=special_ids, max_length=max_length, max_texts=max_texts,
                   batch_size=batch_size, exclude_special=exclude_special, progress=progress,
                   min_length=ANY_MAX_LENGTH, block_size=block_size)  # fmt: skip
    return capture_run(model, reducers, run, tokenizer=tokenizer, max_length=max_length, verify=verify)
