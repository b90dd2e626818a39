"""Data-conditioned content-free scores (SPEC §13): `fhat` / `profiles` with texts.

The model runs once over the texts through the capture layer (`posprobe.capture`, hidden states only); one reducer
(`analysis.hidden_means.HiddenMeanAccumulator`) keeps the running sums of the hidden states entering the analysed
layers; their means are handed to the score functions (`families.context.LayerInputs`, an argument, not state of the
model reader), and the score modules compute SPEC §9's scores of that input exactly as they do for the
embedding-level one (the layer's norm, projections, biases, q/k norms, positional mechanism, scaling, soft cap). Two
inputs:

- 'mean': x_l, the mean over texts and real tokens at positions i >= 1, the same at every position: the scores
  of rotary, ALiBi and bucket-bias models depend on k = j - i alone (Toeplitz by construction), and those of an
  absolute table are one number per head (the table entered only through x_l and the mean averages it away).
- 'position-mean': x_l(i), the mean over texts at each position i, for the leading positions with at least
  `min_texts` texts: the matrices are no longer Toeplitz by construction and their R^2 is a finding.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from os import PathLike
from typing import Any

from posprobe.analysis.hidden_means import INPUTS, MEAN, POSITION_MEAN, HiddenMeanAccumulator
from posprobe.architectures.table import KIND_NAMES, TABLE_KINDS
from posprobe.capture.textrun import DEFAULT_BATCH_SIZE, TextRun, check_run_settings, text_run
from posprobe.checkpoint.in_memory import is_model_object
from posprobe.errors import ArgumentValueError, PosprobeError
from posprobe.families.context import require_hidden_layer_inputs
from posprobe.families.kv_sharing import key_source
from posprobe.pipelines.defaults import MIN_TEXTS
from posprobe.pipelines.score_reader import MIN_POSITIONS, ScoreReader
from posprobe.validation import as_choice, as_int

DEFAULT_MIN_TEXTS = MIN_TEXTS


@dataclass(frozen=True)
class TextSettings:
    """How to condition scores on texts (checked by `text_settings`): the run over texts (`run`, a `TextRun`:
    texts or token ids, max length, max texts, batch size, device, progress, text source), the `input` ('mean' or
    'position-mean'; None: chosen by the model) and `min_texts` (position-mean: positions with fewer texts are not
    analysed)."""

    run: TextRun
    input: str | None
    min_texts: int
    edits: tuple = ()  # SPEC §20: parsed edits applied in every pass over the texts

    @property
    def per_position(self) -> bool:
        return self.input == POSITION_MEAN


def text_settings(
    texts: Iterable[str] | None = None,
    input_ids: Iterable[list[int]] | None = None,
    special_ids: Iterable[int] | None = None,
    input: str | None = MEAN,
    min_texts: int = DEFAULT_MIN_TEXTS,
    max_length: int | None = None,
    max_texts: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str | None = None,
    progress: Callable[[int], None] | None = None,
    text_source: str | None = None,
    max_memory: dict | str | None = None,
    edits: Iterable | str | None = None,
) -> TextSettings | None:
    """The checked settings, or None when neither `texts` nor `input_ids` is given (then every other setting must
    keep its default: they only apply to texts). The run's max length is at least `MIN_POSITIONS`. `edits`
    (SPEC §20) are parsed here and checked against the model's config before its weights are read (`run_texts`)."""
    from posprobe.edits import parse_edits

    edits = parse_edits(edits)
    if input is not None:  # None: chosen by the model (`default_input`)
        input = as_choice(input, "input", INPUTS)
    min_texts = as_int(min_texts, "min_texts", minimum=1)
    if texts is None and input_ids is None:
        max_length, max_texts, batch_size, _ = check_run_settings(
            max_length, max_texts, batch_size, min_length=MIN_POSITIONS
        )
        given = {
            "input": input not in (None, MEAN),
            "min_texts": min_texts != DEFAULT_MIN_TEXTS,
            "max_length": max_length is not None,
            "max_texts": max_texts is not None,
            "batch_size": batch_size != DEFAULT_BATCH_SIZE,
            "special_ids": bool(special_ids),
            "max_memory": max_memory is not None,
            "edit": bool(edits),
        }
        for name, set_ in given.items():
            if set_:
                raise ArgumentValueError(
                    name, "{arg} applies to data-conditioned scores, and no texts were given", "pass texts too"
                )
        return None
    run = text_run(texts, input_ids, special_ids=special_ids, max_length=max_length, max_texts=max_texts,
                   batch_size=batch_size, device=device, max_memory=max_memory, progress=progress,
                   text_source=text_source, min_length=MIN_POSITIONS)  # fmt: skip
    return TextSettings(run, input, min_texts, edits)


def capture_target(model: Any, source) -> Any:
    """What to load for the run on text: the caller's model (hub id, folder, None or a loaded model), or an already
    resolved `source` itself (`capture.model.load_for_capture` does not resolve it again)."""
    if source is not None:
        return source
    return os.fspath(model) if isinstance(model, PathLike) and not is_model_object(model) else model


def condition_reader(
    reader: ScoreReader, layers: list[int], settings: TextSettings, model: Any, allow_pickle: bool, positions
) -> tuple[ScoreReader, dict]:
    """Run the model (`model`: what `capture_target` gives) on the texts and return a new `ScoreReader` of the mean
    hidden states entering `layers` (0-based, checked) as its layer inputs (`reader` is left as it was) (positions: the
    caller's `positions`; for 'position-mean' by default every leading position with at least `min_texts` texts)
    and the conditioning record (`conditioning` in results and JSON)."""
    ctx = reader.ctx
    source = ctx.source
    if settings.input is None:
        settings = replace(settings, input=default_input(ctx.kind))
    if ctx.family.encoder_decoder or source.config.get("is_encoder_decoder"):
        raise PosprobeError(
            f"'{source.name}' ({source.model_type}) is an encoder-decoder model: texts run through encoders and "
            "decoders only, so its scores cannot be conditioned on text",
            "drop --text (texts=) for its content-free scores (SPEC §9)",
        )
    if reader.stack == "decoder":  # Funnel's upsampling decoder: texts give the hidden states entering its encoder
        raise PosprobeError(
            f"'{source.name}' ({source.model_type}): posprobe reads text's hidden states entering its encoder layers, "
            "not its decoder's",
            "drop --text (texts=) for its content-free scores (SPEC §9), or drop --stack decoder",
        )
    require_hidden_layer_inputs(ctx)
    # a layer that reuses an earlier layer's keys (Gemma 4) needs that layer's input too (families.kv_sharing)
    needed = list(dict.fromkeys([*layers, *(key_source(ctx, layer) for layer in layers)]))
    means, summary, max_length = hidden_means(model, needed, settings, allow_pickle)
    n = positions
    if settings.per_position:
        available = means.positions_with(settings.min_texts)
        if available < MIN_POSITIONS:
            raise ArgumentValueError(
                "min_texts",
                f"only {available} position(s) have at least {{arg={settings.min_texts}}} texts; position-mean needs "
                f"at least {MIN_POSITIONS}",
                "pass more or longer texts, or a smaller {arg}",
            )
        if positions is None:
            n = min(available, reader.n)  # at most the default number of positions
        elif positions > available:
            raise ArgumentValueError(
                "positions",
                f"{positions} positions do not fit the texts: {available} positions have at least "
                f"{settings.min_texts} texts",
                f"use {{arg}} {available} or less, or pass more or longer texts",
            )
        inputs = {layer: means.layer(layer)[:n] for layer in needed}
    else:
        inputs = {layer: means.layer(layer) for layer in needed}
    conditioned = ScoreReader(ctx, n, reader.stack, inputs=ctx.layer_inputs(inputs))
    record = {
        "input": settings.input,
        "text": settings.run.text_source,
        "n_texts": summary.n_texts,
        # the tokens averaged into the analysed inputs: position-mean uses only positions 0..n-1
        "n_tokens": int(means.texts_at[: conditioned.n].sum()) if settings.per_position else means.n_tokens,
        "max_length": max_length,
        "longest_text": summary.longest,
        "layers": list(layers),
        "edits": [e.text for e in settings.edits],
    }
    if settings.per_position:
        record |= {"min_texts": settings.min_texts, "texts_at": means.texts_at[: conditioned.n].tolist()}
    record["note"] = conditioning_note(ctx.kind, settings.input)
    return conditioned, record


def default_input(kind: str) -> str:
    """The input used when none is asked for: 'position-mean' for a model whose positions are an absolute table
    (learned or sinusoidal), where 'mean' averages the table away and leaves every score of a head the same
    number; 'mean' for every other position kind (rotary, ALiBi, relative biases), which 'mean' shows as they are."""
    return POSITION_MEAN if kind in TABLE_KINDS else MEAN


def conditioning_note(kind: str, input: str) -> str:
    """What the data-conditioned scores of a model of position kind `kind` with input `input` can show."""
    if input == POSITION_MEAN:
        return (
            "x_l(i) differs along the sequence: the score matrices are not Toeplitz by construction, and their "
            "Toeplitz R² is a finding"
        )
    if kind in TABLE_KINDS:
        return (
            f"the {KIND_NAMES[kind]} enters only through x_l (the model adds it before layer 0) and the mean over "
            "positions averages it away: every score of a head is the same number, R² is undefined — use "
            "--input position-mean (input='position-mean') for one input per position"
        )
    return "x_l is the same at every position: only the model's relative mechanism makes scores depend on k = j − i"


def run_on_texts(model: Any, make_reducers: Callable, settings: TextSettings, allow_pickle: bool):
    """Load `model` (what `capture_target` gives) and run it once over the texts of `settings` (`run_texts`),
    feeding the reducers `make_reducers(max_length, device)` returns; (reducers, CaptureSummary, max_length)."""
    from posprobe.capture.textrun import run_texts

    make = lambda loaded: make_reducers(loaded.max_length, loaded.device)  # noqa: E731
    output = run_texts(model, settings.run, make, allow_pickle=allow_pickle, edits=settings.edits)
    return output.reducers, output.summary, output.model.max_length


def hidden_means(model: Any, layers: list[int], settings: TextSettings, allow_pickle: bool):
    """(HiddenMeans, CaptureSummary, max_length) of one run over the texts."""
    (accumulator,), summary, max_length = run_on_texts(
        model, lambda length, device: [HiddenMeanAccumulator(layers, settings.input, length, device)], settings,
        allow_pickle,
    )  # fmt: skip
    try:
        means = accumulator.result()
    except ValueError as err:
        raise PosprobeError(
            "the texts have no token after the first one, so there is nothing to average (SPEC §13 leaves out "
            "position 0)",
            "pass longer texts, or --input position-mean",
        ) from err
    return means, summary, max_length
