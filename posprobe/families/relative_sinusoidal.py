"""Content-free scores of sinusoidal relative attention, Transformer-XL style: XLNet's content stream, Funnel's first
block (SPEC §9).

Row i is the query position, column j the key position. Per head h, with q_h and k_h the query and key of the
layer's input (`ctx.query_key`), u_h and v_h the layer's learned biases (XLNet's r_w_bias, r_r_bias) and W_R the
layer's projection (d, H, d_h) of the relative encodings:

    F[h, i, j] = ((q_h(i) + u_h) . k_h(j) + (q_h(i) + v_h) . (R(i - j) @ W_R[:, h])) * scaling

R(t) (d,) = [sin(t w_0), ..., sin(t w_{d/2-1}), cos(t w_0), ..., cos(t w_{d/2-1})], w_f = 10000^(-2f/d), for the
distance t = i - j (query less key), clamped to +-clamp_len where the config sets clamp_len > 0 (XLNet); computed in
float32 (XLNet) or float64 (Funnel builds them in the weights' dtype) as the entry's `tensors['encodings']` says.
Funnel with separate_cls keeps its <cls> (position 0) apart: the position and segment terms are zero in row 0 and
column 0. The segment term (q_h(i) + s_h) . seg_h[same segment] is, on a text of one segment, one value per query:
Funnel always adds it (token types default to zeros; `tensors['segment_embedding']`, row
`tensors['same_segment']`); XLNet adds none where no token types are given (transformers' default).
"""

from __future__ import annotations

import numpy as np

from posprobe.architectures import table as T


def sinusoid_encodings(distances: np.ndarray, width: int, clamp: int | None = None, dtype: str = "float32"):
    """R (T, width) float64 numpy of integer distances (T,): [sin(t w) | cos(t w)], w_f = 10000^(-2f/width), computed
    in torch `dtype` (XLNet's `relative_positional_encoding`: float32); distances clamped to +-clamp where clamp > 0."""
    import torch

    precision = getattr(torch, dtype)
    t = torch.as_tensor(distances, dtype=torch.int64).to(precision)
    if clamp is not None and clamp > 0:
        t = t.clamp(-clamp, clamp)
    inv_freq = 1 / torch.pow(10000, torch.arange(0, width, 2, dtype=torch.int64).to(precision) / width)
    angles = t[:, None] * inv_freq
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1).double().numpy()


def relative_scores(
    q: np.ndarray, k: np.ndarray, u: np.ndarray, v: np.ndarray, position_keys: np.ndarray, cls_apart: bool = False
) -> np.ndarray:
    """Unscaled scores (H, n, n): q (H, d_h) or (H, n, d_h) queries, k (H, d_h) or (H, n, d_h) keys, u and v (H, d_h)
    the content and position biases, `position_keys` (H, 2n - 1, d_h) the projected encodings of the distances
    t = i - j = -(n - 1) .. n - 1 (row t + n - 1); `cls_apart`: no position term for query 0 or key 0."""
    n = (position_keys.shape[1] + 1) // 2
    qs = q if q.ndim == 3 else np.broadcast_to(q[:, None], (q.shape[0], n, q.shape[1]))
    ks = k if k.ndim == 3 else np.broadcast_to(k[:, None], (k.shape[0], n, k.shape[1]))
    content = (qs + u[:, None]) @ ks.transpose(0, 2, 1)  # (H, n, n)
    by_distance = (qs + v[:, None]) @ position_keys.transpose(0, 2, 1)  # (H, n, 2n - 1): query i, distance t
    i, j = np.indices((n, n))
    position = np.take_along_axis(by_distance, (i - j + n - 1)[None], axis=2)
    if cls_apart:
        position = position * ((i > 0) & (j > 0))
    return content + position


def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder", inputs=None) -> np.ndarray:
    """F_hat (H, n, n) float64 of `layer` (`ModelContext`; the entry's `tensors` name W_R, u, v and the config key
    of the clamp); `inputs`: data-conditioned layer inputs (`LayerInputs`, SPEC §13) or None."""
    names, stored = ctx.family.tensors, ctx.stored_layer(layer)
    q, k = ctx.query_key(layer, stack, inputs)
    u = ctx.tensor(names["content_bias"], stored, stack)
    v = ctx.tensor(names["position_bias"], stored, stack)
    w_r = ctx.tensor(names["position_projection"], stored, stack)  # (d, H, d_h)
    clamp = ctx.config.get(names["clamp"]) if "clamp" in names else None
    width = w_r.shape[0]
    encodings = sinusoid_encodings(np.arange(-(n - 1), n), width, None if clamp is None else int(clamp),
                                   names.get("encodings", "float32"))  # fmt: skip
    position_keys = np.einsum("td,dhe->hte", encodings, w_r)  # (H, 2n - 1, d_h)
    scores = relative_scores(q, k, u, v, position_keys, cls_apart(ctx))
    if "segment_embedding" in names:  # one segment: every pair in the same one
        same = ctx.tensor(names["segment_embedding"], stored, stack)[int(names["same_segment"])]  # (H, d_h)
        scores = scores + segment_term(q, ctx.tensor(names["segment_bias"], stored, stack), same, n, cls_apart(ctx))
    return scores * ctx.scaling


def segment_term(q: np.ndarray, s: np.ndarray, segment: np.ndarray, n: int, cls_apart: bool = False) -> np.ndarray:
    """Unscaled segment scores (H, n, n) of a text of one segment: (q_h(i) + s_h) . segment_h for every key, q (H, d_h)
    or (H, n, d_h), s and segment (H, d_h) (the bias and the same-segment embedding); `cls_apart`: zero for query 0
    or key 0."""
    qs = q if q.ndim == 3 else np.broadcast_to(q[:, None], (q.shape[0], n, q.shape[1]))
    term = np.broadcast_to(np.einsum("hid,hd->hi", qs + s[:, None], segment)[:, :, None], (q.shape[0], n, n))
    i, j = np.indices((n, n))
    return term * ((i > 0) & (j > 0)) if cls_apart else term


def cls_apart(ctx) -> bool:
    """True when the model keeps position 0 (<cls>) out of the position term (Funnel's separate_cls)."""
    key = ctx.family.tensors.get("cls_apart")
    return key is not None and T.config_flag(ctx.config, key)


def toeplitz_by_construction(ctx, stack: str = "encoder", conditioned: bool = False) -> bool:
    """For an input that is the same at every position, (q + u) . k is one constant per head and the position term
    depends on i - j alone: always, unless position 0 is kept apart (Funnel's separate_cls: its row and column lack
    the position term)."""
    return not cls_apart(ctx)
