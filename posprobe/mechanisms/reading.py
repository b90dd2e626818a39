"""How each mechanism's parameters read as functions of `k = j - i` (SPEC §11): one reading per mechanism, which its
catalogue entry names (`MechanismInfo.reading`); `posprobe.analysis.learned` only asks the entry.

Pure numpy, no torch. A reading takes one part's parameters stacked over depths, `{name: (L, ...)}` float64 with
the names of the torch module (`a`, `beta`, `dynamic.w`, ...), the offsets `(K,)` (increasing) and the mean
vectors of real text `{role: (L, H, d_h)}` (role "query", "key" or "value"; empty when no text was run), and
returns `{array name: array}` (the names and shapes `posprobe.analysis.learned` documents). Tables have 2r+1 rows,
row `clip(k, -r, r) + r`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

Params = Mapping[str, np.ndarray]
Means = Mapping[str, np.ndarray]

# The kind of each array a reading returns: head (L, H, K), layer (L, K), channels (L, K, d), filters (L, 3, d, K).
KINDS = {
    "functions": "head",
    "dynamic_norms": "layer",
    "dynamic_scores": "head",
    "key_dynamic_norms": "layer",
    "key_dynamic_scores": "head",
    "shaw_values_norms": "layer",
    "shaw_values_scores": "head",
    "depthwise": "channels",
    "cat_filters": "filters",
    "conv_qkv_filters": "filters",
}


def tisa_functions(a: np.ndarray, b: np.ndarray, c: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """`f(k) = sum_s a_s exp(-|b_s| (k - c_s)^2)` for kernels `(..., S)` at `offsets` (K,) -> `(..., K)`."""
    k = np.asarray(offsets, dtype=np.float64)
    a, b, c = (np.asarray(t, dtype=np.float64)[..., None, :] for t in (a, b, c))  # (..., 1, S)
    return (a * np.exp(-np.abs(b) * (k[:, None] - c) ** 2)).sum(-1)


def table_rows(offsets: np.ndarray, size: int, sign: int = 1) -> np.ndarray:
    """Row index `clip(sign * k, -r, r) + r` of a `(2r+1)`-row table (`size` = 2r+1) for each offset."""
    r = (size - 1) // 2
    return np.clip(sign * np.asarray(offsets), -r, r) + r


def filter_taps(filters: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Taps `(..., 2r+1)` (column `k + r`) at `offsets` -> `(..., K)`, zero where |k| > r."""
    r = (filters.shape[-1] - 1) // 2
    k = np.asarray(offsets)
    inside = np.abs(k) <= r
    out = np.zeros(filters.shape[:-1] + (k.size,), dtype=np.float64)
    out[..., inside] = filters[..., k[inside] + r]
    return out


def table_functions(prefix: str, table: np.ndarray, offsets, mean: np.ndarray | None, sign: int, unit: bool) -> dict:
    """Norms (L, K) and, given per-head mean vectors `(L, H, d_h)`, scores (L, H, K) of a relative table
    `(L, 2r+1, d_h)`."""
    rows = table[:, table_rows(offsets, table.shape[1], sign)]  # (L, K, d_h)
    out = {f"{prefix}_norms": np.linalg.norm(rows, axis=-1)}
    if mean is not None:
        mean = np.asarray(mean, dtype=np.float64)
        if unit:
            scale = 1.0 / np.maximum(np.linalg.norm(mean, axis=-1, keepdims=True), 1e-30)  # (L, H, 1)
        else:
            scale = np.full(mean.shape[:-1] + (1,), table.shape[-1] ** -0.5)
        out[f"{prefix}_scores"] = np.einsum("lhd,lkd->lhk", mean * scale, rows)
    return out


# ------------------------------------------------------------------------------------ one reading per mechanism
def read_tisa(p: Params, offsets, means: Means) -> dict:
    """TISA: `functions` (L, H, K) = f_h(k) of its Gaussian kernels `a`, `b`, `c` (L, H, S)."""
    return {"functions": tisa_functions(p["a"], p["b"], p["c"], offsets)}


def read_fixed(p: Params, offsets, means: Means) -> dict:
    """Fixed convolution: `functions` (L, H, K) = beta[h, clip(k)]."""
    beta = p["beta"]  # (L, H, 2r+1)
    return {"functions": beta[:, :, table_rows(offsets, beta.shape[-1])]}


def read_dynamic(p: Params, offsets, means: Means) -> dict:
    """Query-based table w (L, 2r+1, d_h): per-offset norms, with text the score q_mean . w[clip(k)] / sqrt(d_h)."""
    return table_functions("dynamic", p["w"], offsets, means.get("query"), 1, False)


def read_composite(p: Params, offsets, means: Means) -> dict:
    """Composite attention: its fixed part's `functions` and its dynamic part's arrays."""
    return read_fixed({"beta": p["fixed.beta"]}, offsets, means) | read_dynamic({"w": p["dynamic.w"]}, offsets, means)


def read_key_dynamic(p: Params, offsets, means: Means) -> dict:
    """Key-based table u, indexed by i - j: norms, with text k_mean . u[clip(-k)] / sqrt(d_h)."""
    return table_functions("key_dynamic", p["w"], offsets, means.get("key"), -1, False)


def read_shaw_values(p: Params, offsets, means: Means) -> dict:
    """Relative values a_V: norms, with text a_V[clip(k)] along the head's unit mean value."""
    return table_functions("shaw_values", p["a_v"], offsets, means.get("value"), 1, True)


def read_depthwise(p: Params, offsets, means: Means) -> dict:
    """Depthwise convolution of the values: `depthwise` (L, K, d) = beta[clip(k), c]."""
    beta = p["beta"]  # (L, 2r+1, d)
    return {"depthwise": beta[:, table_rows(offsets, beta.shape[1])]}


def read_cat(p: Params, offsets, means: Means) -> dict:
    """CAT: the query/key/value filter taps (L, 3, d, K), zero beyond r."""
    return {"cat_filters": filter_taps(p["filters"], offsets)}


def read_conv_qkv(p: Params, offsets, means: Means) -> dict:
    """Convolutional Q/K/V: the depthwise filter taps (L, 3, d, K), zero beyond r."""
    return {"conv_qkv_filters": filter_taps(p["depthwise"], offsets)}
