"""Queries and keys of compressed convolutional attention (CCA, ZAYA): q and k mixed along the sequence by causal
convolutions.

For layer-input rows x_i (n, d) (after the layer's input norm), per position i:
- p_q(i) = x_i W_q + b_q (H d_h), p_k(i) = x_i W_k + b_k (H_kv d_h);
- residual paths: r_q,h(i) = (p_q,h(i) + p_k,g(h)(i)) / 2 (g(h) the key head query head h reads), r_k,g(i) the mean
  of r_q over the query heads of group g;
- [c_q | c_k](i): the channels [p_q | p_k] through a depthwise causal convolution (kernel cca_time0) then a grouped
  one (kernel cca_time1, one group per head), zeros before position 0 (so the first cca_time0 + cca_time1 - 2
  positions see zeros: their q and k differ from the later ones' even for a constant input);
- q = c_q + r_q, k = c_k + r_k, each head's vector rescaled to length sqrt(d_h), each key head's times its learned
  temperature; the rotary embedding then acts on them as in any rotary layer.
Shapes: H query heads, H_kv key heads, d_h head size; `ctx` a `posprobe.families.context.ModelContext`.
"""

from __future__ import annotations

import numpy as np


def cca_query_key(ctx, rows: np.ndarray, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """q (H, m, d_h) and k (H_kv, m, d_h) of layer-input rows (m, d): a sequence from position 0 where m > 1; one row
    stands for a constant input, whose q and k are then those of every position past the convolutions' reach."""
    import torch

    names, s = ctx.family.tensors, ctx.shape
    depthwise = ctx.tensor(names["conv_depthwise"] + ".weight", layer)  # (C, 1, t0)
    grouped = ctx.tensor(names["conv_grouped"] + ".weight", layer)  # (C, C / groups, t1)
    reach = depthwise.shape[-1] + grouped.shape[-1] - 2
    steady = rows.shape[0] == 1
    x = np.repeat(rows, reach + 1, axis=0) if steady else rows
    weights = ctx.attention(layer)
    pq, pk = weights.queries(x), weights.keys(x)  # (H, m, d_h), (H_kv, m, d_h)
    groups = s.heads // s.kv_heads
    rq = (pq + np.repeat(pk, groups, axis=0)) / 2
    rk = rq.reshape(s.kv_heads, groups, *rq.shape[1:]).mean(1)
    channels = np.concatenate([pq.transpose(1, 0, 2).reshape(len(x), -1), pk.transpose(1, 0, 2).reshape(len(x), -1)], 1)
    signal = torch.nn.functional.pad(torch.from_numpy(channels.T[None]), (reach, 0))  # (1, C, reach + m)
    b_dw, b_g = (
        ctx.optional(names["conv_depthwise"] + ".bias", layer),
        ctx.optional(names["conv_grouped"] + ".bias", layer),
    )
    mixed = torch.nn.functional.conv1d(
        signal, torch.from_numpy(depthwise), None if b_dw is None else torch.from_numpy(b_dw), groups=depthwise.shape[0]
    )
    mixed = torch.nn.functional.conv1d(
        mixed, torch.from_numpy(grouped), None if b_g is None else torch.from_numpy(b_g), groups=s.heads + s.kv_heads
    )
    mixed = mixed[0].numpy().T  # (m, C)
    width = s.heads * s.head_dim
    cq = mixed[:, :width].reshape(len(x), s.heads, s.head_dim).transpose(1, 0, 2)
    ck = mixed[:, width:].reshape(len(x), s.kv_heads, s.head_dim).transpose(1, 0, 2)
    q, k = _unit(cq + rq, s.head_dim), _unit(ck + rk, s.head_dim)
    k = k * ctx.tensor(names["key_temperature"], layer)[:, None, None]
    return (q[:, -1:], k[:, -1:]) if steady else (q, k)


def _unit(x: np.ndarray, head_dim: int) -> np.ndarray:
    """Each vector of x (..., d_h) rescaled to length sqrt(d_h) (its length clamped below by float64's eps)."""
    return x * (head_dim**0.5 / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), np.finfo(np.float64).eps))
