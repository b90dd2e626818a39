"""Content-free scores of sinusoidal relative attention, Transformer-XL style: XLNet's content stream (SPEC §9).

Row i is the query position, column j the key position. Per head h, with q_h and k_h the query and key of the
layer's input (`ctx.query_key`), u_h and v_h the layer's learned biases (XLNet's r_w_bias, r_r_bias) and W_R the
layer's projection (d, H, d_h) of the relative encodings:

    F[h, i, j] = ((q_h(i) + u_h) . k_h(j) + (q_h(i) + v_h) . (R(i - j) @ W_R[:, h])) * scaling

R(t) (d,) = [sin(t w_0), ..., sin(t w_{d/2-1}), cos(t w_0), ..., cos(t w_{d/2-1})], w_f = 10000^(-2f/d), for the
distance t = i - j (query less key), clamped to +-clamp_len where the config sets clamp_len > 0; computed in float32
as the model computes it. XLNet's segment term (q_h + s_h) . seg[same segment] is one constant per head on a text
of one segment, and absent where no token types are given (transformers' default): not part of F.
"""

from __future__ import annotations

import numpy as np


def sinusoid_encodings(distances: np.ndarray, width: int, clamp: int | None = None) -> np.ndarray:
    """R (T, width) float64 of integer distances (T,): [sin(t w) | cos(t w)], w_f = 10000^(-2f/width), computed in
    float32 as XLNet's `relative_positional_encoding` does; distances clamped to +-clamp where clamp > 0."""
    import torch

    t = torch.as_tensor(distances, dtype=torch.int64).float()
    if clamp is not None and clamp > 0:
        t = t.clamp(-clamp, clamp)
    inv_freq = 1 / torch.pow(10000, torch.arange(0, width, 2.0, dtype=torch.int64).float() / width)
    angles = t[:, None] * inv_freq
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1).double().numpy()


def relative_scores(
    q: np.ndarray, k: np.ndarray, u: np.ndarray, v: np.ndarray, position_keys: np.ndarray
) -> np.ndarray:
    """Unscaled scores (H, n, n): q (H, d_h) or (H, n, d_h) queries, k (H, d_h) or (H, n, d_h) keys, u and v (H, d_h)
    the content and position biases, `position_keys` (H, 2n - 1, d_h) the projected encodings of the distances
    t = i - j = -(n - 1) .. n - 1 (row t + n - 1)."""
    n = (position_keys.shape[1] + 1) // 2
    qs = q if q.ndim == 3 else np.broadcast_to(q[:, None], (q.shape[0], n, q.shape[1]))
    ks = k if k.ndim == 3 else np.broadcast_to(k[:, None], (k.shape[0], n, k.shape[1]))
    content = (qs + u[:, None]) @ ks.transpose(0, 2, 1)  # (H, n, n)
    by_distance = (qs + v[:, None]) @ position_keys.transpose(0, 2, 1)  # (H, n, 2n - 1): query i, distance t
    i, j = np.indices((n, n))
    return content + np.take_along_axis(by_distance, (i - j + n - 1)[None], axis=2)


def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder", inputs=None) -> np.ndarray:
    """F_hat (H, n, n) float64 of `layer` (`ModelContext`; the entry's `tensors` name W_R, u, v and the config key
    of the clamp); `inputs`: data-conditioned layer inputs (`LayerInputs`, SPEC §13) or None."""
    names, stored = ctx.family.tensors, ctx.stored_layer(layer)
    q, k = ctx.query_key(layer, stack, inputs)
    u = ctx.tensor(names["content_bias"], stored, stack)
    v = ctx.tensor(names["position_bias"], stored, stack)
    w_r = ctx.tensor(names["position_projection"], stored, stack)  # (d, H, d_h)
    clamp = ctx.config.get(names["clamp"])
    encodings = sinusoid_encodings(np.arange(-(n - 1), n), w_r.shape[0], None if clamp is None else int(clamp))
    position_keys = np.einsum("td,dhe->hte", encodings, w_r)  # (H, 2n - 1, d_h)
    return relative_scores(q, k, u, v, position_keys) * ctx.scaling


def toeplitz_by_construction(ctx, stack: str = "encoder", conditioned: bool = False) -> bool:
    """Always, for an input that is the same at every position: (q + u) . k is one constant per head and the
    position term depends on i - j alone."""
    return True
