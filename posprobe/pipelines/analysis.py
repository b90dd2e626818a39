"""Position analyses of a checkpoint: P and its Toeplitz R^2, F_hat_P per head, head profiles, comparisons.

Each analysis (`toeplitz`, `fhat`, `profiles`, `compare`) takes a model as a hub id, a local folder, None (the packaged
all-MiniLM-L6-v2) or a loaded transformers model object, reads only the tensors it needs (lazily from
safetensors for ids and folders, from `state_dict()` for objects; the same code either way) and returns a frozen
result with a short repr, `.plot()`, `.to_dict()` and `.to_json()`. Nothing is printed and nothing is written:
the CLI writes files. Arguments are checked here (posprobe.validation), with the library's argument names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from os import PathLike
from typing import TYPE_CHECKING

import numpy as np

from posprobe.analysis.fhat import MODES
from posprobe.analysis.position_products import position_inner_products
from posprobe.analysis.toeplitz import block_r2, diagonal_means, offsets, sections, toeplitz_r2
from posprobe.checkpoint import ModelSource, WeightReader, resolve_model
from posprobe.checkpoint.in_memory import IN_MEMORY, StateDictReader, is_model_object, source_from_model
from posprobe.errors import ArgumentError, ArgumentTypeError, ArgumentValueError, PosprobeError
from posprobe.families.context import CONTENT_FREE, STACKS, ModelContext, check_analysable, content_free_scores
from posprobe.families.table import LEARNED
from posprobe.results import ResultMixin, middle_ellipsis, short
from posprobe.validation import as_bool, as_choice, as_int, as_int_list

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DEFAULT_BLOCK = 128
DEFAULT_POSITIONS = 512  # positions analysed by default where the model has no table: min(its maximum, this)
DEFAULT_PROFILE_WINDOW = 20  # half-width of the profile summary and sections (the fit's own default is tisa_fit's)
MIN_POSITIONS = 2


# ------------------------------------------------------------------------------------------ shared
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
        return ModelContext(source, WeightReader(source.path, source.weight_format), mode)
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
    return ModelContext(source, WeightReader(source.path, source.weight_format), mode)


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


def _r2(value) -> float | None:
    """An R^2 for JSON: None where undefined (constant matrix)."""
    return None if value is None or not math.isfinite(float(value)) else float(value)


# ---------------------------------------------------------------------------------------------- P
@dataclass(frozen=True, repr=False)
class ToeplitzResult(ResultMixin):
    """P = E_P E_P^T of one model and its Toeplitz R^2.

    `matrix` (n, n) float64, row i / column j = positions; `toeplitz_r2` R^2 of the whole matrix (None when
    undefined: a constant matrix); `blocks` {size: R^2} of the leading size x size blocks; `skipped_blocks`
    the default block sizes that did not fit the table (e.g. 128 on a 64-position model).
    """

    model: str
    model_type: str
    n_positions: int
    dropped_rows: int
    cosine: bool
    matrix: np.ndarray
    toeplitz_r2: float | None
    blocks: dict[int, float | None]
    skipped_blocks: tuple[int, ...] = ()

    _repr_fields = ("model", "n_positions", "toeplitz_r2", "blocks", "skipped_blocks", "cosine", "matrix")

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "n_positions": self.n_positions,
            "dropped_rows": self.dropped_rows,
            "cosine": self.cosine,
            "toeplitz_r2": _r2(self.toeplitz_r2),
            "blocks": {str(b): _r2(r) for b, r in self.blocks.items()},
            "skipped_blocks": list(self.skipped_blocks),
        }

    def plot(self):
        """Heatmap of P (a matplotlib Figure)."""
        from posprobe import plotting

        return plotting.heatmap(self)


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
    )


# ------------------------------------------------------------------------------------------ F_hat
@dataclass(frozen=True, repr=False)
class FhatResult(ResultMixin):
    """F_hat_P of one layer: `matrices` (H, n, n) (row i = query, column j = key), `toeplitz_r2` (H,) per head
    (NaN where undefined: a constant matrix). `weights_layer` is the stored layer used (0 at every ALBERT depth).
    `mode` is 'paper' or 'faithful' for learned tables, 'content-free' (SPEC §9) for other families;
    `position_kind` the family's mechanism (posprobe.families.KINDS); `causal`: the model only uses k <= 0
    (j <= i), the entries above the diagonal are what the scores would be, never seen by its softmax;
    `stack` the encoder or decoder stack of an encoder-decoder model; `layer_kind` how the layer attends ('global',
    'local |k| <= w', its rotary setting where layer types differ: `posprobe.families.windows.LayerKind`)."""

    model: str
    model_type: str
    layer: int
    weights_layer: int
    mode: str
    matrices: np.ndarray
    toeplitz_r2: np.ndarray
    position_kind: str = LEARNED
    causal: bool = False
    stack: str | None = "encoder"  # None: the model has one stack
    layer_kind: str = "global"

    _repr_fields = ("model", "layer", "mode", "mean_toeplitz_r2", "toeplitz_r2", "matrices")

    @property
    def n_heads(self) -> int:
        return self.matrices.shape[0]

    @property
    def mean_toeplitz_r2(self) -> float | None:
        """Mean R^2 over the heads where it is defined (None if it is defined for none)."""
        defined = self.toeplitz_r2[np.isfinite(self.toeplitz_r2)]
        return float(np.mean(defined)) if defined.size else None

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "position_kind": self.position_kind,
            "causal": self.causal,
            "stack": self.stack,
            "layer": self.layer,
            "layer_kind": self.layer_kind,
            "weights_layer": self.weights_layer,
            "mode": self.mode,
            "n_positions": self.matrices.shape[-1],
            "mean_toeplitz_r2": self.mean_toeplitz_r2,
            "heads": [{"head": h, "toeplitz_r2": _r2(r)} for h, r in enumerate(self.toeplitz_r2)],
        }

    def plot(self):
        """One panel per head (posprobe.plotting.fhat_grid): displays in a notebook, `.savefig(path)` writes it."""
        from posprobe import plotting

        figure = plotting.fhat_grid(self)
        if not hasattr(figure, "_repr_png_") and hasattr(plotting, "mosaic_figure"):  # a mosaic that cannot display
            figure = plotting.mosaic_figure(figure)
        return figure


class _FhatComputer:
    """F_hat_P of any layer of one checkpoint through its model reader: the score module of the model's position
    kind (SPEC §3 for absolute tables in paper or faithful mode, §9 content-free scores otherwise) over
    `positions` positions (default: the whole absolute table, else min(the model's maximum, DEFAULT_POSITIONS))
    of stack `stack`."""

    def __init__(self, ctx: ModelContext, positions=None, stack: str = "encoder"):
        stack = as_choice(stack, "stack", STACKS)
        positions = None if positions is None else as_int(positions, "positions", minimum=MIN_POSITIONS)
        self.ctx, self.source, self.family, self.stack = ctx, ctx.source, ctx.family, stack
        if stack == "decoder" and not self.family.encoder_decoder:
            source = ctx.source
            what = "its encoder stack only" if source.config.get("is_encoder_decoder") else "one stack, no decoder"
            raise ArgumentValueError(
                "stack", f"posprobe reads '{source.name}' ({source.model_type}): {what}", "drop {arg}"
            )
        self.kind, self.mode = ctx.kind, ctx.score_mode
        self.n_layers = ctx.layers(stack)
        self.causal = ctx.causal(stack)
        maximum = ctx.max_positions
        if ctx.has_table and self.mode != CONTENT_FREE:
            _check_positions(maximum, ctx.source.name)
            self.n = self._check_n(positions, maximum, "its position table has")
        else:
            if positions is None:
                positions = min(maximum or DEFAULT_POSITIONS, DEFAULT_POSITIONS)
            self.n = self._check_n(positions, maximum, "its config allows") if maximum else positions
        ctx.word_mean  # noqa: B018  (read the vocabulary once, before any layer)

    @property
    def reported_stack(self) -> str | None:
        """The stack results name: 'encoder'/'decoder' for an encoder-decoder model, None for one stack."""
        return self.stack if self.family.encoder_decoder or self.source.config.get("is_encoder_decoder") else None

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

    def layer(self, layer: int) -> FhatResult:
        f = content_free_scores(self.ctx, layer, self.n, self.stack)
        return FhatResult(
            self.source.name,
            self.source.model_type,
            layer,
            self.ctx.stored_layer(layer),
            self.mode,
            f,
            np.asarray(toeplitz_r2(f), dtype=np.float64),
            self.kind,
            self.causal,
            self.reported_stack,
            self.layer_kind(layer),
        )

    def layer_kind(self, layer: int) -> str:
        """How `layer` attends, in words (`LayerKind.describe`)."""
        return self.ctx.layer_kinds(self.n, self.stack)[layer].describe()


def fhat(
    model: str | PathLike | PreTrainedModel | None = None,
    layer: int = 0,
    mode: str = "paper",
    allow_pickle: bool = False,
    source: ModelSource | None = None,
    positions: int | None = None,
    stack: str = "encoder",
) -> FhatResult:
    """F_hat_P (H, n, n) for every head of `layer` (SPEC §3, §9) and each head's Toeplitz R^2.

    model: hub id, folder, None (packaged MiniLM) or a loaded transformers model. layer: 0-based, -1 = last.
    mode: 'paper' (position terms only) or 'faithful' (the real layer input for the average word); families
    without a learned table always give the content-free scores of SPEC §9 (mode 'content-free').
    positions: n analysed (default: the whole learned table, else min(the model's maximum, 512)).
    stack: 'encoder' or 'decoder' (encoder-decoder models).
    """
    mode = as_choice(mode, "mode", MODES)
    as_int(layer, "layer")
    computer = _FhatComputer(open_model(model, allow_pickle, source, mode), positions, stack)
    source = computer.source
    return computer.layer(_layer_index(layer, computer.n_layers, source.name))


# --------------------------------------------------------------------------------------- profiles
@dataclass(frozen=True, repr=False)
class ProfileResult(ResultMixin):
    """Head profiles over k = j - i: `profiles` (L_sel, H, 2n-1) for `layers`, `offsets` (2n-1,) increasing.

    Index i of the first axis is layer `layers[i]` (use `layer_index(layer)` or `profile(layer, head)`).
    `sections` (L_sel, H, 5, 2w+1) are rows `section_rows` of F_hat_P re-indexed by k in -w..w;
    `fhat_r2` (L_sel, H) the Toeplitz R^2 of each head's F_hat_P (NaN where undefined). `shared_layers` is True
    for ALBERT, where every depth uses the same weights. `causal`: the model only uses k <= 0 (the profile at
    k > 0 is what its scores would be there, never seen by its softmax); `position_kind` and `stack` as in
    `FhatResult`; `layer_kinds` how each layer of `layers` attends (`FhatResult.layer_kind`).
    """

    model: str
    model_type: str
    mode: str
    layers: list[int]
    offsets: np.ndarray
    profiles: np.ndarray
    fhat_r2: np.ndarray
    window: int
    section_rows: list[int]
    sections: np.ndarray
    n_positions: int
    n_heads: int
    n_layers: int
    shared_layers: bool
    extra: dict = field(default_factory=dict)
    position_kind: str = LEARNED
    causal: bool = False
    stack: str | None = "encoder"  # None: the model has one stack
    layer_kinds: list[str] | None = None  # None: not recorded (a profiles file written before issue 22)

    _repr_fields = ("model", "mode", "layers", "n_heads", "n_positions", "window", "causal", "profiles", "offsets")

    def layer_index(self, layer: int) -> int:
        """Position in `layers` (the first axis of the arrays) of model layer `layer` (-1 = the model's last)."""
        layer = _layer_index(layer, self.n_layers, self.model)
        if layer not in self.layers:
            raise ArgumentValueError(
                "layer",
                f"layer {layer} was not computed (this result holds layers {self.layers})",
                "compute it with profiles(model, layers=[...])",
            )
        return self.layers.index(layer)

    def profile(self, layer: int, head: int) -> np.ndarray:
        """The profile (2n-1,) over `offsets` of `head` in model layer `layer`."""
        head = as_int(head, "head")
        if not -self.n_heads <= head < self.n_heads:
            raise ArgumentValueError("head", f"head {head} does not exist (valid: 0..{self.n_heads - 1})")
        return self.profiles[self.layer_index(layer), head]

    def metadata(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "mode": self.mode,
            "layers": self.layers,
            "window": self.window,
            "section_rows": self.section_rows,
            "n_positions": self.n_positions,
            "n_heads": self.n_heads,
            "n_layers": self.n_layers,
            "shared_layers": self.shared_layers,
            "position_kind": self.position_kind,
            "causal": self.causal,
            "stack": self.stack,
            "layer_kinds": self.layer_kinds,
            "convention": "k = j - i (query i, key j); profiles over k = -(n-1)..n-1 increasing"
            + ("; causal model: only k <= 0 is used" if self.causal else ""),
        }

    def to_dict(self) -> dict:
        w = self.window
        centre = self.n_positions - 1
        out = dict(self.metadata())
        out["heads"] = [
            {
                "layer": l,
                "head": h,
                "toeplitz_r2": _r2(self.fhat_r2[li, h]),
                "peak_offset": int(
                    self.offsets[centre - w + int(np.argmax(self.profiles[li, h, centre - w : centre + w + 1]))]
                ),
                "profile_window": self.profiles[li, h, centre - w : centre + w + 1].tolist(),
            }
            for li, l in enumerate(self.layers)
            for h in range(self.n_heads)
        ]
        return out

    def plot(self, layer: int | None = None):
        """Profiles and sections of every head of model layer `layer` (default: the first computed one)."""
        from posprobe import plotting

        index = 0 if layer is None else self.layer_index(layer)
        return plotting.profile_grid(self, index)


def profiles(
    model: str | PathLike | PreTrainedModel | None = None,
    layers: list[int] | str | None = None,
    mode: str = "paper",
    allow_pickle: bool = False,
    window: int = DEFAULT_PROFILE_WINDOW,
    source: ModelSource | None = None,
    positions: int | None = None,
    stack: str = "encoder",
) -> ProfileResult:
    """Profiles (diagonal means of F_hat_P over k = j - i) of every head of `layers`, plus 5 sections each.

    layers: a list of layer indices (-1 = last), or None / 'all' for every layer. window: half-width w of the
    sections and of the summary in `to_dict()` (1 <= w <= n - 1). mode: 'paper' or 'faithful' (learned tables;
    other families give SPEC §9 content-free scores). positions: n analysed (default: the whole learned table,
    else min(the model's maximum, 512)). stack: 'encoder' or 'decoder' (encoder-decoder models).
    """
    mode = as_choice(mode, "mode", MODES)
    if not (isinstance(layers, str) and layers == "all"):
        layers = as_int_list(layers, "layers")
    window = as_int(window, "window", minimum=1)
    computer = _FhatComputer(open_model(model, allow_pickle, source, mode), positions, stack)
    source = computer.source
    n_layers = computer.n_layers
    if layers is None or layers == "all":
        layers = list(range(n_layers))
    else:
        layers = list(dict.fromkeys(_layer_index(x, n_layers, source.name, "layers") for x in layers))
    n = computer.n
    if window > n - 1:
        raise ArgumentValueError(
            "window", f"window {window} does not fit {n} positions", f"use {{arg}} between 1 and {n - 1}"
        )
    rows = section_rows(n, window)
    shared = computer.family.shared_layers
    profiles_, r2s, secs, cache = [], [], [], {}
    for layer in layers:
        stored = 0 if shared else layer
        if stored not in cache:
            res = computer.layer(layer)
            cache[stored] = (diagonal_means(res.matrices), res.toeplitz_r2, sections(res.matrices, rows, window))
        p, r, s = cache[stored]
        profiles_.append(p), r2s.append(r), secs.append(s)
    return ProfileResult(
        source.name,
        source.model_type,
        computer.mode,
        layers,
        offsets(n),
        np.stack(profiles_),
        np.stack(r2s),
        window,
        rows,
        np.stack(secs),
        n,
        computer.n_heads,
        n_layers,
        shared,
        position_kind=computer.kind,
        causal=computer.causal,
        stack=computer.reported_stack,
        layer_kinds=[computer.layer_kind(layer) for layer in layers],
    )


def section_rows(n: int, window: int, count: int = 5) -> list[int]:
    """`count` query rows spread over the table, each with a full window -w..w of keys where possible."""
    lo, hi = (window, n - 1 - window) if n - 1 - window >= window else (0, n - 1)
    return sorted({int(round(x)) for x in np.linspace(lo, hi, count)})


# ---------------------------------------------------------------------------------------- compare
@dataclass(frozen=True, repr=False)
class CompareRow(ResultMixin):
    """One model of a comparison: positions, R^2 of P (whole, first 128), mean per-head F_hat_P R^2 (layer 0);
    `matrix` (n, n) is its P (a family without a learned table: the head-mean of its layer-0 content-free
    scores, and no R^2 of P). An R^2 is None where undefined (or, for the block, where n < 128)."""

    model: str
    label: str  # a short name, distinct within the comparison (ModelSource.label, or the shortened path)
    n_positions: int
    toeplitz_r2: float | None
    r2_first_128: float | None
    mean_fhat_r2: float | None
    matrix: np.ndarray
    position_kind: str = LEARNED
    causal: bool = False
    mode: str = "paper"
    has_table: bool = True  # `matrix` is P of an absolute table (also one beside a relative bias: MPNet)

    @property
    def matrix_name(self) -> str:
        """What `matrix` is: P for a position table, else the head-mean of layer 0's content-free scores."""
        return "P" if self.has_table else "mean F̂ over heads, layer 0"

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "label": self.label,
            "position_kind": self.position_kind,
            "causal": self.causal,
            "mode": self.mode,
            "n_positions": self.n_positions,
            "toeplitz_r2": _r2(self.toeplitz_r2),
            "r2_first_128": _r2(self.r2_first_128),
            "mean_fhat_r2": _r2(self.mean_fhat_r2),
        }


@dataclass(frozen=True, repr=False)
class CompareResult(ResultMixin):
    """Rows of a comparison, one per model (iterate it, index it, or read `rows`)."""

    mode: str
    cosine: bool
    rows: tuple[CompareRow, ...]

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]

    def __repr__(self) -> str:
        models = ", ".join(f"{r.label}: R²={short(r.toeplitz_r2)}" for r in self.rows)
        return f"CompareResult(mode={self.mode!r}, cosine={self.cosine}, rows=[{models}])"

    def to_dict(self) -> dict:
        return {"mode": self.mode, "cosine": self.cosine, "models": [r.to_dict() for r in self.rows]}

    def plot(self):
        """Side-by-side P heatmaps."""
        from posprobe import plotting

        return plotting.compare_heatmaps(list(self.rows))


def compare(
    models: list[str | PathLike | PreTrainedModel | None],
    mode: str = "paper",
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
        computer = _FhatComputer(ctx, positions)
        f = computer.layer(0)
        has_table = ctx.has_table  # also a table beside a relative bias: MPNet
        if has_table:
            table = ctx.position_table.table[: computer.n]
            p = position_inner_products(table, cosine=cosine)
            first = block_r2(p, DEFAULT_BLOCK) if computer.n >= DEFAULT_BLOCK else None
            whole = toeplitz_r2(p)
        else:
            p, first, whole = f.matrices.mean(axis=0), None, None
        rows.append(
            CompareRow(
                source.name,
                label,
                computer.n,
                whole,
                first,
                f.mean_toeplitz_r2,
                p,
                computer.kind,
                computer.causal,
                computer.mode,
                has_table,
            )  # fmt: skip
        )
    return CompareResult(mode, cosine, tuple(rows))
