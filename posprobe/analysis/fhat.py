"""F_hat_P: the average positional contribution to each head's pre-softmax scores (SPEC §3).

Shapes: n positions, e embedding width, d hidden width, H heads, d_h = d / H. Weights use torch's
Linear layout (out, in): q = x @ Wq.T + bq. Head h owns output features h*d_h .. (h+1)*d_h - 1.
Row i is the query position, column j the key position (offset k = j - i).

paper mode     F_h = (e_w Wq_h Wk_h^T E_P^T + E_P Wq_h Wk_h^T e_w^T + E_P Wq_h Wk_h^T E_P^T) / sqrt(d_h)
faithful mode  F_h = (X Wq_h^T + bq_h)(X Wk_h^T + bk_h)^T / sqrt(d_h), X = the real layer input with the
               average word at every position (built by the model reader, `ModelContext.embedding_rows`).

Factorised embeddings: the projection x -> x M^T + m is affine; in paper mode its linear part maps the
position rows (E_P M^T) and the constant part goes with the word (e_w M^T + m), so that the two still add
up to the projected input exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODES = ("paper", "faithful")


@dataclass(frozen=True)
class LayerInput:
    """First-layer inputs in the hidden width d: `positions` (n, d) and `word` (d,) (paper mode), or
    `full` (n, d) = the complete input rows (faithful mode; then `positions`/`word` are None)."""

    positions: np.ndarray | None = None
    word: np.ndarray | None = None
    full: np.ndarray | None = None


def paper_input(
    positions: np.ndarray, word_mean: np.ndarray, projection: tuple[np.ndarray, np.ndarray] | None = None
) -> LayerInput:
    """Paper-mode inputs: E_P (n, e) and e_w (e,), projected to the hidden width if factorised."""
    if projection is None:
        return LayerInput(positions=positions, word=word_mean)
    w, b = projection
    return LayerInput(positions=positions @ w.T, word=word_mean @ w.T + b)


def fhat_matrices(
    layer_input: LayerInput,
    wq: np.ndarray,
    wk: np.ndarray,
    n_heads: int,
    bq: np.ndarray | None = None,
    bk: np.ndarray | None = None,
    scale: float | None = None,
) -> np.ndarray:
    """F_hat_P for every head: (H, n, n). Paper mode ignores the biases, faithful mode uses them. `scale`
    multiplies q.k (default 1 / sqrt(d_h))."""
    d = wq.shape[0]
    if d % n_heads:
        raise ValueError(
            f"hidden size {d} is not divisible by {n_heads} heads — pass the model's num_attention_heads and its "
            "query/key weights (out, in) as stored"
        )
    dh = d // n_heads
    scale = 1.0 / np.sqrt(dh) if scale is None else scale

    def per_head(x: np.ndarray) -> np.ndarray:  # (..., d) -> (H, ..., d_h), contiguous so matmul uses BLAS
        return np.ascontiguousarray(np.moveaxis(x.reshape(*x.shape[:-1], n_heads, dh), -2, 0))

    if layer_input.full is not None:
        q = per_head(layer_input.full @ wq.T + (0 if bq is None else bq))  # (H, n, d_h)
        k = per_head(layer_input.full @ wk.T + (0 if bk is None else bk))
        scores = q @ np.ascontiguousarray(k.transpose(0, 2, 1))
        scores *= scale
        return scores
    qp = per_head(layer_input.positions @ wq.T)  # (H, n, d_h)
    kp = per_head(layer_input.positions @ wk.T)
    qw = per_head(layer_input.word @ wq.T)  # (H, d_h)
    kw = per_head(layer_input.word @ wk.T)
    scores = qp @ np.ascontiguousarray(kp.transpose(0, 2, 1))  # (H, n, n), built in place below
    scores += np.einsum("hd,hjd->hj", qw, kp)[:, None, :]  # word-to-position: varies with key j only
    scores += np.einsum("hid,hd->hi", qp, kw)[:, :, None]  # position-to-word: varies with query i only
    scores *= scale
    return scores


def present_heads(values: np.ndarray, trailing: int) -> np.ndarray:
    """(..., H) bool of per-head arrays `values` (..., H, then `trailing` axes): False for a head with no value at
    all in a layer where another head has one, a head the layer does not have (SPEC §9: a layer with fewer query
    heads than the model's most, Laguna); results leave such heads out, as absent, not zero. A layer with no score
    at all (a hybrid's layer without softmax attention) keeps its heads."""
    values = np.asarray(values, dtype=np.float64)
    scored = ~np.isnan(values.reshape(*values.shape[: values.ndim - trailing], -1)).all(-1)
    return scored | ~scored.any(-1, keepdims=True)
