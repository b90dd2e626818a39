"""Dynamic mask attention (Doge): a learned bias computed from each key's value is added to every score.

For a layer input row x_j (d,) (after the layer's input norm), the values v_j = x_j W_V^T + b_V (H_kv d_h, all key
heads side by side) give one bias per key head g: b_g(j) = exp(A_g * softplus((v_j W_dt^T + b_dt)_g)), with A (H_kv,)
and the Linear dt_proj (H_kv, H_kv d_h) of the layer. The layer's score of query i and key j is then
(R_i q) . (R_j k) * scaling + b_g(j), query head h reading the bias of its key head g = h // (H / H_kv); the bias
rides in the model's attention mask, on the pairs the mask lets through.

Content-free scores (SPEC §9): every position holds the same input, so b_g is one constant per head, which the
softmax ignores but the scores hold. Per-position inputs (SPEC §13) give each key its own bias. Beyond
config.keep_window_size keys, each query keeps only the keys with the largest bias (content-dependent): posprobe
gives every pair's score, and a layer's kind says where this applies.
"""

from __future__ import annotations

import numpy as np


def key_bias(ctx, layer: int, x: np.ndarray, heads: int) -> np.ndarray:
    """The dynamic-mask bias of keys with layer-input rows x (m, d): (H, 1, m) for the H query heads, key j's bias
    in column j (m = 1: the same for every key)."""
    names = ctx.family.tensors
    w_v, b_v = ctx.linear(names["value"], layer)
    w_dt, b_dt = ctx.linear(names["dt_proj"], layer)
    a = ctx.tensor(names["dt_scale"], layer)  # (H_kv,)
    dt = (x @ w_v.T + b_v) @ w_dt.T + b_dt  # (m, H_kv)
    bias = np.exp(a * np.logaddexp(0.0, dt))  # softplus
    return np.repeat(bias.T, heads // bias.shape[1], axis=0)[:, None, :]
