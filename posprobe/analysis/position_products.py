"""P = E_P E_P^T, the matrix of inner products between learned position embeddings (SPEC §1)."""

from __future__ import annotations

import numpy as np


def position_inner_products(table: np.ndarray, cosine: bool = False) -> np.ndarray:
    """P (n, n) from the position table E_P (n, e); with `cosine`, rows are unit-normalised first."""
    e = np.asarray(table, dtype=np.float64)
    if cosine:
        norms = np.linalg.norm(e, axis=1, keepdims=True)
        e = e / np.where(norms > 0, norms, 1.0)
    return e @ e.T
