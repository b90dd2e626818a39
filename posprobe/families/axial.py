"""Axial position embeddings (Reformer): the absolute table E_P built from factor tables, as the model builds it.

A model with K axes of sizes s_0 .. s_{K-1} stores one factor table per axis a, of shape (1, .., s_a, .., 1, d_a)
(its size on axis a, 1 on the others, then its width), the widths summing to the hidden size d. Position p, written
in the mixed radix of the axes (p = ((p_0 s_1 + p_1) s_2 + p_2) ..., row-major: the last axis fastest), gets the
concatenation [F_0[p_0] | F_1[p_1] | .. | F_{K-1}[p_{K-1}]] (d,): every factor broadcast over the grid of axes,
concatenated along the width and flattened, as the model does. SPEC §1-3 then read it as any learned table.
"""

from __future__ import annotations

import math

import numpy as np

from posprobe.architectures.config import config_size
from posprobe.errors import PosprobeError


def axial_rows(factors: list[np.ndarray]) -> np.ndarray:
    """E_P (prod s_a, sum d_a) of factor tables `factors` (axis a's of shape (1, .., s_a, .., 1, d_a)); row p the
    concatenation of each axis's row at p's digit on that axis (the last axis fastest). ValueError for factors whose
    shapes do not make such a grid."""
    axes = len(factors)
    if axes == 0 or any(f.ndim != axes + 1 for f in factors):
        raise ValueError("each axial factor needs one dimension per axis, then its width")
    sizes = [f.shape[a] for a, f in enumerate(factors)]
    for a, f in enumerate(factors):
        if any(f.shape[b] != 1 for b in range(axes) if b != a):
            raise ValueError(f"axial factor {a} has shape {f.shape}: size 1 expected off its own axis")
    grid = [np.broadcast_to(f, (*sizes, f.shape[-1])) for f in factors]
    return np.concatenate(grid, axis=-1).reshape(math.prod(sizes), -1)


def axial_table(ctx) -> np.ndarray:
    """The axial table of checkpoint `ctx` (a ModelContext) over the positions the model reads: the first
    min(prod s_a, max_position_embeddings) rows of `axial_rows` of its factor tables (`Family.tensors['axial_factors']`,
    '{a}' the axis)."""
    pattern, name = ctx.family.tensors["axial_factors"], ctx.source.name
    factors = []
    while (key := ctx.key(pattern.replace("{a}", str(len(factors))))) is not None:
        factors.append(ctx.reader.get(key))
    if not factors:
        ctx.tensor(pattern.replace("{a}", "0"))  # raises the clear error
    try:
        rows = axial_rows(factors)
    except ValueError as err:
        raise PosprobeError(f"axial position tables of '{name}': {err}", "the checkpoint is malformed") from None
    if rows.shape[1] != ctx.shape.hidden:
        raise PosprobeError(
            f"axial position tables of '{name}' are {rows.shape[1]} wide in all, not the hidden {ctx.shape.hidden}",
            "the checkpoint is malformed",
        )
    limit = config_size(ctx.config, name, "positions", default=rows.shape[0])
    return rows[: min(rows.shape[0], int(limit))]
