"""Position analyses of a checkpoint: P and its Toeplitz R^2, F_hat_P per head, head profiles, comparisons.

Each `*_analysis` function reads only the tensors it needs (lazily, from safetensors) and returns a frozen
result; writing figures and files is left to `write_*` helpers that the CLI calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from posprobe.analysis.fhat import MODES, faithful_input, fhat_matrices, paper_input
from posprobe.analysis.position_products import position_inner_products
from posprobe.analysis.toeplitz import block_r2, diagonal_means, offsets, sections, toeplitz_r2
from posprobe.checkpoint import (
    ModelSource,
    WeightReader,
    read_attention_weights,
    read_embedding_inputs,
    read_position_table,
    resolve_model,
)
from posprobe.checkpoint.architectures import family_of, model_shape
from posprobe.errors import PosprobeError

DEFAULT_BLOCK = 128
DEFAULT_PROFILE_WINDOW = 20  #: half-width K of the plotted and summarised profile window k = -K..K (not the fit window)


# ---------------------------------------------------------------------------------------------- P
@dataclass(frozen=True)
class ToeplitzResult:
    """P = E_P E_P^T (n, n) of one model, its Toeplitz R^2, and R^2 of leading blocks {size: R^2}."""

    model: str
    model_type: str
    n_positions: int
    dropped_rows: int
    cosine: bool
    matrix: np.ndarray
    toeplitz_r2: float
    blocks: dict[int, float]

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "n_positions": self.n_positions,
            "dropped_rows": self.dropped_rows,
            "cosine": self.cosine,
            "toeplitz_r2": self.toeplitz_r2,
            "blocks": {str(b): r for b, r in self.blocks.items()},
        }


def toeplitz_analysis(
    model: str | None,
    blocks: list[int] | None = None,
    cosine: bool = False,
    allow_pickle: bool = False,
    source: ModelSource | None = None,
) -> ToeplitzResult:
    """P for `model` and its Toeplitz R^2; `blocks` None = [128] when the table is longer than 128."""
    source = source or resolve_model(model, allow_pickle=allow_pickle)
    table = read_position_table(source)
    n = table.n_positions
    blocks = _check_blocks(blocks, n, source.name)
    p = position_inner_products(table.table, cosine=cosine)
    return ToeplitzResult(
        source.name,
        source.model_type,
        n,
        table.dropped_rows,
        cosine,
        p,
        toeplitz_r2(p),
        {b: float(block_r2(p, b)) for b in blocks},
    )


def _check_blocks(blocks: list[int] | None, n: int, name: str) -> list[int]:
    if blocks is None:
        return [DEFAULT_BLOCK] if n > DEFAULT_BLOCK else []
    for b in blocks:
        if not 1 <= b <= n:
            raise PosprobeError(
                f"block {b} does not fit '{name}', whose position table has {n} rows", f"use --block between 1 and {n}"
            )
    return sorted(set(blocks))


# ------------------------------------------------------------------------------------------ F_hat
@dataclass(frozen=True)
class FhatResult:
    """F_hat_P (H, n, n) of one layer, with per-head Toeplitz R^2 (H,)."""

    model: str
    model_type: str
    layer: int
    weights_layer: int
    mode: str
    matrices: np.ndarray
    toeplitz_r2: np.ndarray

    @property
    def n_heads(self) -> int:
        return self.matrices.shape[0]

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "layer": self.layer,
            "weights_layer": self.weights_layer,
            "mode": self.mode,
            "n_positions": self.matrices.shape[-1],
            "mean_toeplitz_r2": float(np.mean(self.toeplitz_r2)),
            "heads": [{"head": h, "toeplitz_r2": float(r)} for h, r in enumerate(self.toeplitz_r2)],
        }


class _FhatComputer:
    """Reads the shared embedding-level inputs once, then F_hat_P for any layer of one checkpoint."""

    def __init__(self, source: ModelSource, mode: str):
        if mode not in MODES:
            raise PosprobeError(f"unknown mode '{mode}'", f"use one of: {', '.join(MODES)}")
        family_of(source)
        self.source, self.mode = source, mode
        self.reader = WeightReader(source.path, source.weight_format)
        self.embeddings = read_embedding_inputs(source, self.reader)
        self.shape = model_shape(source)
        self._paper = None

    def layer(self, layer: int) -> FhatResult:
        attn = read_attention_weights(self.source, layer, self.reader)
        emb = self.embeddings
        if self.mode == "paper":
            if self._paper is None:
                self._paper = paper_input(emb.positions.table, emb.word_mean, emb.projection)
            layer_input = self._paper
            f = fhat_matrices(layer_input, attn.wq, attn.wk, self.shape.n_heads)
        else:
            layer_input = faithful_input(
                emb.positions.table, emb.word_mean, emb.token_type0, emb.layernorm, emb.projection, attn.pre_layernorm
            )
            f = fhat_matrices(layer_input, attn.wq, attn.wk, self.shape.n_heads, attn.bq, attn.bk)
        return FhatResult(
            self.source.name,
            self.source.model_type,
            layer,
            attn.weights_layer,
            self.mode,
            f,
            np.asarray(toeplitz_r2(f)),
        )


def fhat_analysis(
    model: str | None,
    layer: int = 0,
    mode: str = "paper",
    allow_pickle: bool = False,
    source: ModelSource | None = None,
) -> FhatResult:
    """F_hat_P for every head of `layer` (SPEC §3), in `mode` 'paper' or 'faithful'."""
    source = source or resolve_model(model, allow_pickle=allow_pickle)
    return _FhatComputer(source, mode).layer(layer)


# --------------------------------------------------------------------------------------- profiles
@dataclass(frozen=True)
class ProfileResult:
    """Head profiles over k = j - i: `profiles` (L_sel, H, 2n-1) for `layers`, `offsets` (2n-1,) increasing.

    `sections` (L_sel, H, 5, 2w+1) are rows `section_rows` of F_hat_P re-indexed by k in -w..w;
    `fhat_r2` (L_sel, H) the Toeplitz R^2 of each head's F_hat_P. `shared_layers` is True for ALBERT,
    where every depth uses the same weights.
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
            "convention": "k = j - i (query i, key j); profiles over k = -(n-1)..n-1 increasing",
        }

    def to_json(self, npz: Path | None = None) -> dict:
        w = self.window
        centre = self.n_positions - 1
        out = dict(self.metadata())
        out["heads"] = [
            {
                "layer": l,
                "head": h,
                "toeplitz_r2": float(self.fhat_r2[li, h]),
                "peak_offset": int(
                    self.offsets[centre - w + int(np.argmax(self.profiles[li, h, centre - w : centre + w + 1]))]
                ),
                "profile_window": self.profiles[li, h, centre - w : centre + w + 1].tolist(),
            }
            for li, l in enumerate(self.layers)
            for h in range(self.n_heads)
        ]
        if npz is not None:
            out["npz"] = str(npz)
        return out


def compute_profiles(
    model: str | None,
    layers: list[int] | None = None,
    mode: str = "paper",
    allow_pickle: bool = False,
    window: int = DEFAULT_PROFILE_WINDOW,
    source: ModelSource | None = None,
) -> ProfileResult:
    """Profiles (diagonal means of F_hat_P) of every head of `layers` (None = all), plus 5 sections each."""
    source = source or resolve_model(model, allow_pickle=allow_pickle)
    computer = _FhatComputer(source, mode)
    shape = computer.shape
    layers = list(range(shape.n_layers)) if layers is None else list(dict.fromkeys(layers))
    for layer in layers:
        if not 0 <= layer < shape.n_layers:
            raise PosprobeError(
                f"layer {layer} does not exist; '{source.name}' has layers 0..{shape.n_layers - 1}",
                "pick layers with --layers",
            )
    n = computer.embeddings.positions.n_positions
    if not 1 <= window <= n - 1:
        raise PosprobeError(f"window {window} does not fit {n} positions", f"use --window between 1 and {n - 1}")
    rows = section_rows(n, window)
    shared = family_of(source).shared_layers
    profiles, r2s, secs, cache = [], [], [], {}
    for layer in layers:
        stored = 0 if shared else layer
        if stored not in cache:
            res = computer.layer(layer)
            cache[stored] = (diagonal_means(res.matrices), res.toeplitz_r2, sections(res.matrices, rows, window))
        p, r, s = cache[stored]
        profiles.append(p), r2s.append(r), secs.append(s)
    return ProfileResult(
        source.name,
        source.model_type,
        mode,
        layers,
        offsets(n),
        np.stack(profiles),
        np.stack(r2s),
        window,
        rows,
        np.stack(secs),
        n,
        shape.n_heads,
        shape.n_layers,
        shared,
    )


def section_rows(n: int, window: int, count: int = 5) -> list[int]:
    """`count` query rows spread over the table, each with a full window -w..w of keys where possible."""
    lo, hi = (window, n - 1 - window) if n - 1 - window >= window else (0, n - 1)
    return sorted({int(round(x)) for x in np.linspace(lo, hi, count)})


# ---------------------------------------------------------------------------------------- compare
@dataclass(frozen=True)
class CompareRow:
    model: str
    n_positions: int
    toeplitz_r2: float
    r2_first_128: float | None
    mean_fhat_r2: float | None
    matrix: np.ndarray

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "n_positions": self.n_positions,
            "toeplitz_r2": self.toeplitz_r2,
            "r2_first_128": self.r2_first_128,
            "mean_fhat_r2": self.mean_fhat_r2,
        }


def compare_models(
    models: list[str], mode: str = "paper", cosine: bool = False, allow_pickle: bool = False
) -> list[CompareRow]:
    """One row per model: positions, R^2 of P (whole and first 128), mean per-head F_hat_P R^2 (layer 0)."""
    rows = []
    for model in models:
        source = resolve_model(model, allow_pickle=allow_pickle)
        t = toeplitz_analysis(None, blocks=[], cosine=cosine, source=source)
        first = float(block_r2(t.matrix, DEFAULT_BLOCK)) if t.n_positions >= DEFAULT_BLOCK else None
        f = fhat_analysis(None, 0, mode, source=source)
        rows.append(CompareRow(t.model, t.n_positions, t.toeplitz_r2, first, float(np.mean(f.toeplitz_r2)), t.matrix))
    return rows
