"""Toeplitz structure of square matrices: diagonal means, the least-squares Toeplitz fit, and its R^2.

Offsets follow posprobe's convention k = j - i (row i, column j); a vector over k for an n x n matrix
has length 2n - 1 and index `k + n - 1` (k increasing from -(n-1) to n-1).
All functions accept a single matrix (n, n) or a batch (..., n, n); diagonal sums are weighted bincounts
(scatter-adds), never a Python loop over diagonals.
"""

from __future__ import annotations

import numpy as np


def offsets(n: int) -> np.ndarray:
    """Relative offsets k = -(n-1) .. n-1, shape (2n - 1,)."""
    return np.arange(-(n - 1), n)


def _offset_index(n: int) -> np.ndarray:
    """(n, n) integer array: entry (i, j) holds j - i + n - 1, the diagonal's slot in a length-2n-1 vector."""
    idx = np.arange(n)
    return idx[None, :] - idx[:, None] + (n - 1)


def diagonal_means(a: np.ndarray) -> np.ndarray:
    """Mean of each diagonal k = j - i of `a` (..., n, n) -> (..., 2n - 1), k increasing.

    One weighted bincount (a scatter-add) per matrix, all sharing one (n, n) slot index; a batch-wide
    index would cost as much memory as the batch itself.
    """
    a = np.asarray(a, dtype=np.float64)
    n = _check_square(a)
    width = 2 * n - 1
    slots = _offset_index(n).ravel()
    counts = n - np.abs(offsets(n))
    flat = a.reshape(-1, n * n)
    sums = np.empty((flat.shape[0], width))
    for b, matrix in enumerate(flat):
        sums[b] = np.bincount(slots, weights=matrix, minlength=width)
    return (sums / counts).reshape(*a.shape[:-2], width)


def toeplitz_from_diagonals(diagonals: np.ndarray) -> np.ndarray:
    """Inverse of `diagonal_means` for Toeplitz matrices: (..., 2n - 1) -> (..., n, n) with T[i, j] = v[j - i]."""
    diagonals = np.asarray(diagonals, dtype=np.float64)
    width = diagonals.shape[-1]
    if width % 2 != 1:
        raise ValueError(f"a diagonal vector has odd length 2n - 1, got {width}")
    n = (width + 1) // 2
    return diagonals[..., _offset_index(n)]


def toeplitz_fit(a: np.ndarray) -> np.ndarray:
    """The least-squares Toeplitz approximation of `a` (..., n, n): each diagonal replaced by its mean."""
    return toeplitz_from_diagonals(diagonal_means(a))


#: R^2 is undefined when the entries do not vary beyond round-off: when their RMS deviation from the mean is
#: at most R2_RELATIVE_TOL * max|A|. Entries computed in float64 as dot products of e <= ~4096 terms carry a
#: round-off up to ~e * 2.2e-16 ~ 1e-12 of the matrix scale, so a deviation 100 times that is still noise
#: (and would give R^2 anywhere in (-inf, 1]), while real positional structure, even one float32 ulp
#: (6e-8 relative) in the position rows, lies far above it.
R2_RELATIVE_TOL = 1e-10


def toeplitz_r2(a: np.ndarray) -> np.ndarray | float | None:
    """Fraction of the variance of the entries of `a` explained by its best Toeplitz fit.

    R^2 = 1 - RSS / TSS with RSS = sum (A - A_T)^2 and TSS = sum (A - mean(A))^2 over all n^2 entries.
    Returns a float for one matrix, an array (...) for a batch. R^2 is undefined (None for one matrix,
    NaN in a batch) when TSS is zero or negligible, sqrt(TSS / n^2) <= R2_RELATIVE_TOL * max|A|: a constant
    matrix (up to round-off) has no variance to explain. Residuals are formed one matrix at a time, so a
    batch needs only one matrix of scratch memory.
    """
    a = np.asarray(a, dtype=np.float64)
    n = _check_square(a)
    means = diagonal_means(a).reshape(-1, 2 * n - 1)
    flat = a.reshape(-1, n, n)
    index = _offset_index(n)
    r2 = np.empty(flat.shape[0])
    for b, (matrix, diag) in enumerate(zip(flat, means)):
        rss = np.sum((matrix - diag[index]) ** 2)
        tss = np.sum((matrix - matrix.mean()) ** 2)
        floor = matrix.size * (R2_RELATIVE_TOL * np.max(np.abs(matrix))) ** 2
        r2[b] = 1.0 - rss / tss if tss > floor else np.nan
    r2 = r2.reshape(a.shape[:-2])
    if r2.ndim == 0:
        return None if np.isnan(r2) else float(r2)
    return r2


def is_flat(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """True where `values` do not vary along `axis` beyond round-off (the tolerance of `toeplitz_r2`): their range
    is at most R2_RELATIVE_TOL * max|values|. Such a profile has no shape: no peak, nothing to draw but a line."""
    values = np.asarray(values, dtype=np.float64)
    scale = np.max(np.abs(values), axis=axis)
    return np.ptp(values, axis=axis) <= R2_RELATIVE_TOL * scale


def block_r2(a: np.ndarray, block: int) -> np.ndarray | float | None:
    """Toeplitz R^2 of the leading `block` x `block` sub-matrix (e.g. BERT's first 128 positions)."""
    n = _check_square(np.asarray(a))
    if not 1 <= block <= n:
        raise ValueError(f"block {block} is outside 1..{n}")
    return toeplitz_r2(np.asarray(a)[..., :block, :block])


def sections(a: np.ndarray, rows: list[int] | np.ndarray, window: int) -> np.ndarray:
    """Rows `i` of `a` (..., n, n) re-indexed by k = j - i for k in -window..window -> (..., len(rows), 2w+1).

    Entries whose column j = i + k falls outside 0..n-1 are NaN (a row near the edge has no such key).
    """
    a = np.asarray(a, dtype=np.float64)
    n = _check_square(a)
    rows = np.asarray(rows, dtype=int)
    ks = np.arange(-window, window + 1)
    cols = rows[:, None] + ks[None, :]
    valid = (cols >= 0) & (cols < n)
    picked = a[..., rows[:, None], np.clip(cols, 0, n - 1)]
    return np.where(valid, picked, np.nan)


def _check_square(a: np.ndarray) -> int:
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"expected square matrices (..., n, n), got shape {a.shape}")
    return a.shape[-1]


def format_r2(r2, digits: int = 4) -> str:
    """An R^2 for tables and titles: 'undefined (constant matrix)' where it is None or NaN."""
    if r2 is None or not np.isfinite(r2):
        return "undefined (constant matrix)"
    return f"{float(r2):.{digits}f}"
