"""The results of the position analyses (`toeplitz`, `fhat`, `profiles`, `compare`): frozen dataclasses with a
short repr, `to_dict()` / `to_json()` (the CLI's `--json` records, without output paths) and `plot()`.

Convention: row i = query, column j = key; profiles over k = j - i, increasing from -(n-1). An R^2 that is
undefined (a constant matrix) is None (NaN in per-head arrays, null in JSON).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from posprobe.analysis.fhat import present_heads
from posprobe.analysis.hidden_means import POSITION_MEAN
from posprobe.analysis.toeplitz import is_flat
from posprobe.architectures.table import LEARNED
from posprobe.errors import ArgumentValueError
from posprobe.formats.save import OutputFile, Saves, arrays_file, figure_file, record_file
from posprobe.pipelines.score_reader import _layer_index
from posprobe.results import ResultMixin, short
from posprobe.validation import as_int


def by_construction_note(position_kind: str) -> str:
    """Why a model's score matrices are Toeplitz by construction, in words (for text output and captions)."""
    from posprobe.architectures.table import KIND_NAMES

    mechanism = KIND_NAMES.get(position_kind, position_kind)
    return (
        f"Toeplitz by construction: with {mechanism} the scores of an input that is the same at every position "
        "depend on k = j − i alone, so every head's Toeplitz R² is 1 whatever the weights (not measured)"
    )


def _r2(value) -> float | None:
    """An R^2 for JSON: None where undefined (constant matrix)."""
    return None if value is None or not math.isfinite(float(value)) else float(value)


@dataclass(frozen=True, repr=False)
class ToeplitzResult(ResultMixin, Saves):
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
    quantization: str | None = None  # a GGUF file's quantisation: the weights analysed were de-quantised from it

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
            "quantization": self.quantization,
        }

    def output_files(self, fmt: str) -> list[OutputFile]:
        """`P.<fmt>` (`P_cosine` with cosine) and its JSON record beside (`to_dict()` with both paths)."""
        from posprobe.plotting import base as plotting

        return figure_and_record("P_cosine" if self.cosine else "P", fmt, lambda: plotting.heatmap(self), self)

    def plot(self):
        """Heatmap of P (a matplotlib Figure)."""
        from posprobe.plotting import base as plotting

        return plotting.heatmap(self)


@dataclass(frozen=True, repr=False)
class FhatResult(ResultMixin, Saves):
    """F_hat_P of one layer: `matrices` (H, n, n) (row i = query, column j = key), `toeplitz_r2` (H,) per head
    (NaN where undefined: a constant matrix; NaN for every head, not measured, where `toeplitz_by_construction`:
    the model's position kind makes the matrices depend on k = j - i alone whatever the weights, R^2 = 1 by
    construction). `weights_layer` is the stored layer used (0 at every ALBERT depth).
    `mode` is 'paper' or 'faithful' for learned tables, 'content-free' (SPEC §9) for other families,
    'data-conditioned' (SPEC §13) when computed from texts' hidden states (`conditioning` then says how);
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
    toeplitz_by_construction: bool = False
    layer_kind: str = "global"
    quantization: str | None = None  # a GGUF file's quantisation: the weights analysed were de-quantised from it
    conditioning: dict | None = None  # data-conditioned scores (SPEC §13): the input and the texts behind it
    language_model: str | None = None  # a multimodal checkpoint (model_type): the type of the language model read

    _repr_fields = ("model", "layer", "mode", "toeplitz_by_construction", "mean_toeplitz_r2", "toeplitz_r2", "matrices")

    @property
    def n_heads(self) -> int:
        return self.matrices.shape[0]

    @property
    def mean_toeplitz_r2(self) -> float | None:
        """Mean R^2 over the heads where it is defined (None if it is defined for none, or not measured because the
        matrices are Toeplitz by construction)."""
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
            "toeplitz_by_construction": self.toeplitz_by_construction,
            "mean_toeplitz_r2": self.mean_toeplitz_r2,
            "quantization": self.quantization,
            "heads": [
                {"head": h, "toeplitz_r2": _r2(r)}
                for h, (r, present) in enumerate(zip(self.toeplitz_r2, present_heads(self.matrices, 2)))
                if present  # a head the layer does not have (SPEC §9) is left out
            ],
        } | _set_fields(self, "conditioning", "language_model")

    def output_files(self, fmt: str, scale: str = "per-head") -> list[OutputFile]:
        """`fhat_layer<l>_<tag>.<fmt>` (`scale`: 'per-head' or 'shared', see `plotting.base.fhat_grid`) and its JSON
        record beside; `_decoder` ends the name for an encoder-decoder's decoder stack."""
        from posprobe.plotting import base as plotting

        stem = f"fhat_layer{self.layer}_{file_tag(self)}" + ("_decoder" if self.stack == "decoder" else "")
        return figure_and_record(stem, fmt, lambda: plotting.fhat_grid(self, scale), self)

    def plot(self):
        """One panel per head (posprobe.plotting.base.fhat_grid): displays in a notebook, `.savefig(path)` writes it."""
        from posprobe.plotting import base as plotting

        figure = plotting.fhat_grid(self)
        if not hasattr(figure, "_repr_png_") and hasattr(plotting, "mosaic_figure"):  # a mosaic that cannot display
            figure = plotting.mosaic_figure(figure)
        return figure


@dataclass(frozen=True, repr=False)
class ProfileResult(ResultMixin, Saves):
    """Head profiles over k = j - i: `profiles` (L_sel, H, 2n-1) for `layers`, `offsets` (2n-1,) increasing.

    Index i of the first axis is layer `layers[i]` (use `layer_index(layer)` or `profile(layer, head)`).
    `sections` (L_sel, H, 5, 2w+1) are rows `section_rows` of F_hat_P re-indexed by k in -w..w;
    `fhat_r2` (L_sel, H) the Toeplitz R^2 of each head's F_hat_P (NaN where undefined, and everywhere when
    `toeplitz_by_construction`: then F_hat_P depends on k alone, R^2 = 1 is not measured, and every section equals
    the profile). `shared_layers` is True for ALBERT, where every depth uses the same weights. `causal`: the
    model only uses k <= 0 (the profile at k > 0 is what its scores would be there, never seen by its softmax);
    `position_kind` and `stack` as in `FhatResult`; `layer_kinds` how each layer of `layers` attends
    (`FhatResult.layer_kind`).
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
    toeplitz_by_construction: bool = False
    layer_kinds: list[str] | None = None  # None: not recorded (a profiles file written before issue 22)
    quantization: str | None = None  # a GGUF file's quantisation: the weights analysed were de-quantised from it
    conditioning: dict | None = None  # data-conditioned profiles (SPEC §13): the input and the texts behind it
    learned_sink_share: np.ndarray | None = None  # (L_sel, H) learned sinks (gpt-oss): the sink's mean share of the
    # queries' attention under F̂ and each layer's mask (SPEC §9); None for models without learned sinks
    language_model: str | None = None  # a multimodal checkpoint (model_type): the type of the language model read

    _repr_fields = ("model", "mode", "layers", "n_heads", "n_positions", "window", "causal", "profiles", "offsets")
    ARRAYS = {  # profiles_<tag>.npz (formats.arrays; `formats.profiles` reads it); `layer` indexes `layers`
        "profiles": ("layer", "head", "offset"),
        "offsets": ("offset",),
        "layers": ("layer",),
        "fhat_r2": ("layer", "head"),
        "sections": ("layer", "head", "section", "section_offset"),
        "section_rows": ("section",),
    }

    def arrays(self) -> dict[str, np.ndarray]:
        """The .npz arrays (a profiles file: `formats.profiles.read_profile_file` reads it)."""
        return {
            "profiles": self.profiles,
            "offsets": self.offsets,
            "layers": np.asarray(self.layers),
            "fhat_r2": self.fhat_r2,
            "sections": self.sections,
            "section_rows": np.asarray(self.section_rows),
        }

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
        return (
            {
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
                "toeplitz_by_construction": self.toeplitz_by_construction,
                "layer_kinds": self.layer_kinds,
                "quantization": self.quantization,
                "convention": "k = j - i (query i, key j); profiles over k = -(n-1)..n-1 increasing"
                + ("; causal model: only k <= 0 is used" if self.causal else ""),
            }
            | _set_fields(self, "conditioning", "language_model")
            | self._sink_metadata()
        )

    def _sink_metadata(self) -> dict:
        if self.learned_sink_share is None:
            return {}
        shares = [[None if np.isnan(x) else float(x) for x in row] for row in self.learned_sink_share]
        return {"content_free_learned_sink_share": shares}  # null: pooled entries share the softmax (DeepSeek V4)

    def layer_reach(self) -> list[int | None]:
        """The largest |k| each layer of `layers` attends (a local window's reach), None where unlimited; read
        from `layer_kinds` ('local |k| <= 511, ...')."""
        import re

        kinds = self.layer_kinds or [None] * len(self.layers)
        found = [re.search(r"local \|k\| <= (\d+)", kind or "") for kind in kinds]
        return [int(m.group(1)) if m else None for m in found]

    def peak_offsets(self) -> np.ndarray:
        """(L_sel, H) float: the offset k of each profile's maximum over every offset the layer can use — all of
        k = -(n-1)..n-1, only k <= 0 for a causal model (it never uses k > 0, so a peak there would describe
        nothing it does), only |k| <= its window for a local layer — never the edge of the figure window (see
        `peak_beyond_window`). NaN where the profile is flat there up to round-off (`analysis.toeplitz.is_flat`:
        e.g. an absolute table averaged away by a data-conditioned mean), whose argmax would be a pick among
        round-off errors."""
        k = np.asarray(self.offsets)
        peaks = np.full(self.profiles.shape[:2], np.nan)
        for li, reach in enumerate(self.layer_reach()):
            usable = (k <= 0) if self.causal else np.ones(k.shape, dtype=bool)
            if reach is not None:
                usable &= np.abs(k) <= reach
            values = self.profiles[li][:, usable]
            finite = np.isfinite(values)
            best = k[usable][np.argmax(np.where(finite, values, -np.inf), axis=-1)].astype(np.float64)
            row_mean = np.where(finite, values, 0).sum(-1, keepdims=True) / np.maximum(finite.sum(-1, keepdims=True), 1)
            flat = is_flat(np.where(finite, values, row_mean))  # a hybrid's other layers: no score, all NaN
            peaks[li] = np.where(flat | ~finite.any(-1), np.nan, best)
        return peaks

    def peak_at_edge(self) -> np.ndarray:
        """(L_sel, H) bool: the peak is the outermost offset the layer can use (k = -(n-1) or n-1, only the first for a
        causal model, ±its window for a local layer): the profile keeps rising to the end of the positions it
        covers (the table's edge from the weights, the longest text's from texts), so its argmax is where the
        offsets stop, not a peak (issue 49)."""
        k = np.asarray(self.offsets)
        peaks = self.peak_offsets()
        edge = np.zeros(peaks.shape, dtype=bool)
        for li, reach in enumerate(self.layer_reach()):
            usable = (k <= 0) if self.causal else np.ones(k.shape, dtype=bool)
            if reach is not None:
                usable &= np.abs(k) <= reach
            for h in range(peaks.shape[1]):
                covered = k[usable & np.isfinite(self.profiles[li, h])]  # texts: only the offsets they hold
                if not np.isfinite(peaks[li, h]) or covered.size == 0:
                    continue
                ends = {int(covered.min()), int(covered.max())} - ({0} if self.causal else set())  # k = 0: its own
                edge[li, h] = int(peaks[li, h]) in ends  # token, not an end of what a causal layer covers
        return edge

    def peak_beyond_window(self) -> np.ndarray:
        """(L_sel, H) bool: the peak lies outside the figure window -w..w (the figures and `profile_window` do not
        show it)."""
        return np.abs(np.nan_to_num(self.peak_offsets())) > self.window

    def command_record(self, saved) -> dict:
        """`profiles --json`: `to_dict()` with the `.npz` path and the figure paths."""
        return self.to_dict() | {"npz": str(saved["npz"]), "figures": [str(f) for f in saved["figures"]]}

    def to_dict(self) -> dict:
        w = self.window
        centre = self.n_positions - 1
        out = dict(self.metadata())
        peaks, present, edge = self.peak_offsets(), present_heads(self.profiles, 1), self.peak_at_edge()
        out["heads"] = [
            {
                "layer": l,
                "head": h,
                "toeplitz_r2": _r2(self.fhat_r2[li, h]),
                "peak_offset": None if np.isnan(peaks[li, h]) else int(peaks[li, h]),
                "peak_beyond_window": bool(abs(np.nan_to_num(peaks[li, h])) > w),
                "peak_at_edge": bool(edge[li, h]),
                "profile_window": self.profiles[li, h, centre - w : centre + w + 1].tolist(),
            }
            for li, l in enumerate(self.layers)
            for h in range(self.n_heads)
            if present[li, h]  # a head the layer does not have (SPEC §9) is left out
        ]
        return out

    def output_files(self, fmt: str) -> list[OutputFile]:
        """`profiles_<tag>.npz` (a profiles file, `formats.profiles`) and one figure per computed layer."""
        from posprobe.plotting.profiles import profile_pages

        tag = file_tag(self) + ("_decoder" if self.stack == "decoder" else "")
        files = [arrays_file(f"profiles_{tag}.npz", self)]
        pages = profile_pages(self)  # one layout for every layer's page, drawn once
        for i, layer in enumerate(self.layers):
            files.append(OutputFile(f"profiles_layer{layer}_{tag}.{fmt}", "figures", write=pages.writer(i, fmt)))
        return files

    def plot(self, layer: int | None = None):
        """Profiles and sections of every head of model layer `layer` (default: the first computed one)."""
        from posprobe.plotting.profiles import profile_grid

        index = 0 if layer is None else self.layer_index(layer)
        return profile_grid(self, index)


@dataclass(frozen=True, repr=False)
class CompareRow(ResultMixin):
    """One model of a comparison: positions, R^2 of P (whole, first 128), mean per-head F_hat_P R^2 (layer 0);
    `matrix` (n, n) is its P (a family without a learned table: the head-mean of its layer-0 content-free
    scores, and no R^2 of P). An R^2 is None where undefined (or, for the block, where n < 128); `mean_fhat_r2` is
    None where `toeplitz_by_construction` (the layer-0 matrices depend on k = j - i alone whatever the weights)."""

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
    toeplitz_by_construction: bool = False  # of the F_hat_P matrices behind `mean_fhat_r2`
    quantization: str | None = None  # a GGUF file's quantisation: the weights analysed were de-quantised from it

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
            "toeplitz_by_construction": self.toeplitz_by_construction,
            "quantization": self.quantization,
        }


@dataclass(frozen=True, repr=False)
class CompareResult(ResultMixin, Saves):
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

    def output_files(self, fmt: str) -> list[OutputFile]:
        """`compare.<fmt>` (side-by-side heatmaps) and its JSON record beside."""
        from posprobe.plotting import base as plotting

        return figure_and_record("compare", fmt, lambda: plotting.compare_heatmaps(list(self.rows)), self)

    def plot(self):
        """Side-by-side P heatmaps."""
        from posprobe.plotting import base as plotting

        return plotting.compare_heatmaps(list(self.rows))


def file_tag(result) -> str:
    """The mode part of output file names: the result's mode, and the input for 'position-mean'."""
    conditioning = getattr(result, "conditioning", None) or {}
    return result.mode + ("-position-mean" if conditioning.get("input") == POSITION_MEAN else "")


def figure_and_record(stem: str, fmt: str, make_figure, result) -> list[OutputFile]:
    """`{stem}.{fmt}` and `{stem}.json` beside it (the result's dict, with both paths, as the CLI prints it)."""
    figure, record = f"{stem}.{fmt}", f"{stem}.json"
    as_record = lambda saved: (
        result.to_dict() | {"figure": str(saved.paths[figure]), "record": str(saved.paths[record])}
    )  # noqa: E731
    return [figure_file(figure, make_figure), record_file(record, as_record)]


def _set_fields(result, *names: str) -> dict:
    """The record entries of optional fields `names` that are set (not None): the data-conditioning record, the
    language model a multimodal checkpoint was read as."""
    return {name: getattr(result, name) for name in names if getattr(result, name) is not None}
