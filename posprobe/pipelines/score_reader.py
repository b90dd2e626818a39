"""Reading a model for the position analyses: the model reader of a model id / folder / None / loaded model
(`open_model`), the checks of layer indices and position counts, and `ScoreReader`, which resolves how many
positions of which stack are analysed and computes F_hat_P (H, n, n) of any layer (SPEC §3, §9).

Convention: row i = query, column j = key, k = j - i. Nothing is printed or written here.
"""

from __future__ import annotations

from os import PathLike

import numpy as np

from posprobe.checkpoint import ModelSource, resolve_model
from posprobe.checkpoint.in_memory import IN_MEMORY, StateDictReader, is_model_object, source_from_model
from posprobe.checkpoint.weights import open_weights
from posprobe.errors import ArgumentTypeError, ArgumentValueError, PosprobeError
from posprobe.families.context import (
    CONTENT_FREE,
    PER_POSITION_INPUT,
    SAME_INPUT,
    STACKS,
    LayerInputs,
    ModelContext,
    check_analysable,
    content_free_scores,
    toeplitz_by_construction,
)
from posprobe.validation import as_bool, as_choice, as_int

DEFAULT_POSITIONS = 512  # positions analysed by default where the model has no table: min(its maximum, this)
MIN_POSITIONS = 2


def open_model(
    model=None, allow_pickle=False, source: ModelSource | None = None, mode: str = "paper", table: bool = False
) -> ModelContext:
    """The model reader (`ModelContext`) of a model id / folder / None / loaded model object (or of an already
    resolved `source`): the model is resolved once, its family checked (`table`: that it has an absolute
    position table) before any weight is read."""
    if source is not None:
        if source.weight_format == IN_MEMORY:
            raise ArgumentTypeError("source", "pass a model object as `model`, not as {arg}")
        check_analysable(source, table)
        return ModelContext(source, open_weights(source), mode)
    allow_pickle = as_bool(allow_pickle, "allow_pickle")
    if is_model_object(model):
        source = source_from_model(model)
        check_analysable(source, table)
        return ModelContext(source, StateDictReader(model), mode)
    if isinstance(model, PathLike):
        model = str(model)
    if model is not None and not isinstance(model, str):
        raise ArgumentTypeError(
            "model",
            f"{{arg}} must be a hub id, a folder, None or a loaded transformers model, got {type(model).__name__}",
            "e.g. toeplitz('bert-base-uncased'), toeplitz('path/to/folder') or toeplitz(loaded_model)",
        )
    source = resolve_model(model, allow_pickle=allow_pickle)
    check_analysable(source, table)
    return ModelContext(source, open_weights(source), mode)


def _check_positions(n: int, name: str) -> None:
    if n < MIN_POSITIONS:
        raise PosprobeError(
            f"'{name}' has a position table of {n} row(s); a position analysis needs at least {MIN_POSITIONS}",
            "the checkpoint's position table is truncated or malformed; use another checkpoint",
        )


def _layer_index(value, n_layers: int, name: str, argument: str = "layer") -> int:
    """A Python-style layer index (-1 = last) checked against the model; returns it non-negative."""
    value = as_int(value, argument)
    if not -n_layers <= value < n_layers:
        has = "only layer 0" if n_layers == 1 else f"layers 0..{n_layers - 1}"
        raise ArgumentValueError(
            argument,
            f"layer {value} does not exist: '{name}' has {has}",
            f"pass {{arg}} between 0 and {n_layers - 1}, or -1 for the last" if n_layers > 1 else "pass {arg=0}",
        )
    return value % n_layers


class ScoreReader:
    """F_hat_P of any layer of one checkpoint through its model reader: the score module of the model's position
    kind (SPEC §3 for absolute tables in paper or faithful mode, §9 content-free scores otherwise) over
    `positions` positions (default: the whole absolute table, else min(the model's maximum, DEFAULT_POSITIONS))
    of stack `stack`, of the embedding-level input or of data-conditioned layer `inputs` (SPEC §13, handed to every
    score function; the model reader holds no such state). `toeplitz_by_construction`: the matrices depend on
    k = j - i alone whatever the weights (the model's position kind, for inputs of `input_mode`), so their
    Toeplitz R^2 is not measured."""

    def __init__(self, ctx: ModelContext, positions=None, stack: str = "encoder", inputs: LayerInputs | None = None):
        stack = as_choice(stack, "stack", STACKS)
        self.two_stacks = ctx.family.encoder_decoder or bool(ctx.family.decoder_stack)  # both stacks read
        ctx = ctx.for_stack(stack)  # a decoder read through fields of its own (`Family.decoder_stack`)
        positions = None if positions is None else as_int(positions, "positions", minimum=MIN_POSITIONS)
        self.ctx, self.source, self.family, self.stack = ctx, ctx.source, ctx.family, stack
        one_of_two = self.family.text_stack if ctx.source.config.get("is_encoder_decoder") else None  # the one read
        if stack == "decoder" and not self.two_stacks and one_of_two != "decoder":
            source = ctx.source
            what = f"its {one_of_two} stack only" if one_of_two else "one stack, no decoder"
            raise ArgumentValueError(
                "stack", f"posprobe reads '{source.name}' ({source.model_type}): {what}", "drop {arg}"
            )
        self.inputs = inputs
        self.kind, self.mode = ctx.kind, ctx.score_mode(inputs)
        self.n_layers = ctx.layers(stack)
        self.causal = ctx.causal(stack)
        self.input_mode = PER_POSITION_INPUT if inputs is not None and inputs.per_position else SAME_INPUT
        self.toeplitz_by_construction = toeplitz_by_construction(ctx, stack, self.input_mode, inputs is not None)
        maximum = ctx.max_positions
        if ctx.has_table and self.mode != CONTENT_FREE:
            _check_positions(maximum, ctx.source.name)
            self.n = self._check_n(positions, maximum, "its position table has")
        else:
            if positions is None:
                positions = min(maximum or DEFAULT_POSITIONS, DEFAULT_POSITIONS)
            self.n = self._check_n(positions, maximum, "its config allows") if maximum else positions

    @property
    def reported_stack(self) -> str | None:
        """The stack results name: 'encoder'/'decoder' for an encoder-decoder model (of one whose entry reads one
        stack, that one: Whisper's decoder), None for one stack."""
        if self.two_stacks:
            return self.stack
        return self.family.text_stack if self.source.config.get("is_encoder_decoder") else None

    def _check_n(self, positions, available: int, what: str) -> int:
        if positions is None:
            return available
        if positions > available:
            raise ArgumentValueError(
                "positions",
                f"{positions} positions do not fit '{self.source.name}': {what} {available}",
                f"use {{arg}} between {MIN_POSITIONS} and {available}",
            )
        return positions

    @property
    def n_heads(self) -> int:
        return self.ctx.shape.heads

    def layer_kind(self, layer: int) -> str:
        """How `layer` attends, in words (`LayerKind.describe`)."""
        return self.ctx.layer_kinds(self.n, self.stack)[layer].describe()

    def scores(self, layer: int) -> np.ndarray:
        """F_hat_P (H, n, n) of model layer `layer` (0-based, already checked): row i = query, column j = key."""
        return content_free_scores(self.ctx, layer, self.n, self.stack, self.inputs)
