"""Alternating updates (AltUp, Gemma 3n): what a layer's attention reads when its input is a stack of streams.

A Gemma 3n layer does not take one hidden state but K streams (config.altup_num_inputs): stream 0 is the embedding
e, stream i >= 1 a Linear projection of e (`tensors['altup_projections']`, i - 1) rescaled to e's root mean square.
Each layer first predicts every stream from all of them, s_k + sum_j M[k, j] s_j, with mixing coefficients
M (K, K) = prediction_coefs(tanh(modality_router(router_norm(s_a) / d))) read from the active stream a
(config.altup_active_idx); its attention reads the active stream's prediction (then its pre-attention norm).
In the content-free reading (SPEC §9) every layer gets the streams of the embedding-level input, as the model
builds them before its first layer. Shapes: m rows, d hidden width, K streams.
"""

from __future__ import annotations

import numpy as np

from posprobe.architectures import table as T
from posprobe.families.embeddings import apply_norm


def altup_streams(ctx, x: np.ndarray) -> np.ndarray:
    """The K streams (K, m, d) the model stacks from embedding-level rows x (m, d): x itself, then each projection
    of x scaled to x's root mean square (its mean square floored at 1e-5, as the model does)."""
    target = np.sqrt((x**2).mean(-1, keepdims=True))
    streams = [x]
    for i in range(int(ctx.transformers_config.altup_num_inputs) - 1):
        w, _ = ctx.linear(ctx.family.tensors["altup_projections"].format(i=i))
        projected = x @ w.T
        streams.append(projected * target / np.sqrt(np.maximum((projected**2).mean(-1, keepdims=True), 1e-5)))
    return np.stack(streams)


def altup_active_prediction(ctx, streams: np.ndarray, layer: int, stack: str = "encoder") -> np.ndarray:
    """Layer `layer`'s prediction (m, d) of its active stream from `streams` (K, m, d): s_a + sum_j M[a, j] s_j,
    the coefficients M (K, K) per row computed from the active stream by the layer's router."""
    cfg, prefix = ctx.transformers_config, ctx.family.tensors["altup"]
    count, active = int(cfg.altup_num_inputs), int(cfg.altup_active_idx)
    weight, _ = ctx.norm_weights(prefix + ".router_norm", layer, stack)
    routed = apply_norm(streams[active], T.RMSNORM, weight, None, ctx.shape.eps) * np.float32(1.0 / ctx.shape.hidden)
    router, _ = ctx.linear(prefix + ".modality_router", layer, stack)  # (K, d)
    coefs, _ = ctx.linear(prefix + ".prediction_coefs", layer, stack)  # (K * K, K)
    mixing = (np.tanh(routed @ router.T) @ coefs.T).reshape(-1, count, count)  # (m, K, K): M[k, j] per row
    return streams[active] + np.einsum("mj,jmd->md", mixing[:, active], streams)


def altup_input(ctx, x: np.ndarray, layer: int, stack: str = "encoder") -> np.ndarray:
    """Embedding-level rows x (m, d) as layer `layer`'s attention input before its pre-attention norm: the
    layer's AltUp prediction of the active stream of x's streams."""
    rows = np.atleast_2d(x)
    out = altup_active_prediction(ctx, altup_streams(ctx, rows), layer, stack)
    return out if x.ndim == 2 else out[0]
