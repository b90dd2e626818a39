"""Fused and grouped Q/K/V projections -> canonical per-head weights (`table.QKV_LAYOUTS`).

Shapes: d the width the projection reads, H query heads, H_kv key heads, d_h head size. Canonical per-head
weights: q_h = x @ W_Q[h] + b_Q[h] with W_Q (H, d, d_h), b_Q (H, d_h); likewise the keys (H_kv of them).
A layout that does not fit the sizes raises ValueError (the model reader turns it into one clear line).
"""

from __future__ import annotations

import numpy as np

from posprobe.architectures import table as T


def head_split(w: np.ndarray, b: np.ndarray | None, heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Linear rows (heads * d_h, d) -> per-head (heads, d, d_h) and bias (heads, d_h)."""
    per = w.reshape(heads, head_dim, w.shape[-1]).transpose(0, 2, 1)
    bias = np.zeros((heads, head_dim)) if b is None else b.reshape(heads, head_dim)
    return np.ascontiguousarray(per), bias


def grouped_conv_dense(w: np.ndarray, width: int) -> np.ndarray:
    """A kernel-1 grouped Conv1d weight (out, in / groups, 1) as the dense Linear rows (out, in) it applies
    (block diagonal: group g maps inputs g*in/groups.. to outputs g*out/groups..)."""
    w = w.reshape(w.shape[0], -1)
    groups = width // w.shape[1]
    if groups * w.shape[1] != width or w.shape[0] % groups:
        raise ValueError
    out, inp = w.shape[0] // groups, w.shape[1]
    dense = np.zeros((w.shape[0], width))
    for g in range(groups):
        dense[g * out : (g + 1) * out, g * inp : (g + 1) * inp] = w[g * out : (g + 1) * out]
    return dense


def split_fused(layout: str, w: np.ndarray, b: np.ndarray | None, heads: int, kv_heads: int, head_dim: int,
                blocks: int = 1):  # fmt: skip
    """((W_Q, b_Q), (W_K, b_K)) per head from one fused projection `w` (stored layout) and its bias `b` (or None)."""
    qd, kd = heads * head_dim, kv_heads * head_dim
    if layout == T.GPT2_CONV1D:  # Conv1D (d, 3d): y = x @ W + b, columns [q | k | v]
        wt, bias = w.T, (np.zeros(w.shape[1]) if b is None else b)
        return head_split(wt[:qd], bias[:qd], heads, head_dim), head_split(wt[qd : qd + kd], bias[qd : qd + kd],
                                                                             kv_heads, head_dim)  # fmt: skip
    rows = w.shape[-1]
    bias = np.zeros(w.shape[0]) if b is None else b
    if layout == T.PER_HEAD:  # rows grouped per head: [q_h; k_h; v_h]
        per = w.reshape(heads, 3, head_dim, rows)
        pb = bias.reshape(heads, 3, head_dim)
        return _heads(per[:, 0], pb[:, 0]), _heads(per[:, 1], pb[:, 1])
    if layout == T.KV_GROUPED:  # per key head g: [q of its m query heads; k_g; v_g]
        m = heads // kv_heads
        per = w.reshape(kv_heads, m + 2, head_dim, rows)
        pb = bias.reshape(kv_heads, m + 2, head_dim)
        q = per[:, :m].reshape(heads, head_dim, rows), pb[:, :m].reshape(heads, head_dim)
        return _heads(*q), _heads(per[:, m], pb[:, m])
    if layout == T.BLOCKED:  # `blocks` equal row blocks, each [q; v; k] slices of the features (CodeGen)
        per = w.reshape(blocks, 3, qd // blocks, rows)
        pb = bias.reshape(blocks, 3, qd // blocks)
        return (head_split(per[:, 0].reshape(qd, rows), pb[:, 0].reshape(qd), heads, head_dim),
                head_split(per[:, 2].reshape(qd, rows), pb[:, 2].reshape(qd), kv_heads, head_dim))  # fmt: skip
    if layout == T.STACKED:  # rows [q (H d_h); k (H_kv d_h); v]
        if w.shape[0] < qd + kd:
            raise ValueError
        return head_split(w[:qd], bias[:qd], heads, head_dim), head_split(w[qd : qd + kd], bias[qd : qd + kd],
                                                                           kv_heads, head_dim)  # fmt: skip
    raise ValueError(f"not a fused layout: {layout}")


def _heads(per: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(G, d_h, d) rows per head -> (G, d, d_h) and bias (G, d_h)."""
    return np.ascontiguousarray(per.transpose(0, 2, 1)), bias
