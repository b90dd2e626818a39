"""Mixture of attention heads (JetMoE's MoA): each token's query projection is routed among experts, the key is
one projection shared by every expert.

A layer has E query experts W_e (H_kv d_h, d) and a router W_r (E, d); a layer input row x (d,) (after the layer's
input norm) picks the top_k experts e_1 .. e_top_k of the router logits x W_r^T (taken in float32, as the router
computes them; ranked by logit, ties to the lower index), and its query heads are h = s H_kv + g for slot s and key
head g: q_h = x W_{e_s}[g] (rows g d_h .. g d_h + d_h - 1), with no bias. Keys k_g = x W_K[g] come from the first
half of the shared kv projection; query head h reads key head h mod H_kv (the keys are tiled per slot, not repeated
per group). The gates of the top_k experts weigh their output projections, after attention: they do not enter the
scores.

Content-free scores (SPEC §9): every position holds the same input, so every position picks the same experts and
F̂(i, j) = (R_i q_h) . (R_j k_{h mod H_kv}) * scaling with those experts' queries: the heads the module runs on that
sequence. A per-position input (SPEC §13) routes each row by itself.

Shapes: H = top_k H_kv query heads, d_h head size, d hidden, m rows; `ctx` a `posprobe.families.context.ModelContext`.
"""

from __future__ import annotations

import numpy as np


def routed_experts(logits: np.ndarray, top_k: int) -> np.ndarray:
    """The experts (m, top_k) each row's router logits (m, E) pick, best first: float32 logits as the router
    takes them, equal logits in expert order."""
    ranked = np.argsort(-logits.astype(np.float32), axis=-1, kind="stable")
    return ranked[:, :top_k]


def routed_query_key(ctx, x: np.ndarray, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """Queries (H, m, d_h) of layer-input rows x (m, d), each from the experts its router picks, and keys
    (H, m, d_h): the key head each query head reads (head h reads key head h mod H_kv)."""
    f, s = ctx.family, ctx.shape
    experts = ctx.tensor(f.query + ".weight", layer)  # (E, H_kv d_h, d)
    router = ctx.tensor(f.tensors["router"] + ".weight", layer)  # (E, d)
    top_k = s.heads // int(ctx.config["num_key_value_heads"])
    if experts.ndim != 3 or experts.shape[0] != router.shape[0] or experts.shape[1] * top_k != s.heads * s.head_dim:
        from posprobe.architectures.config import MIXED_HINT, config_hint
        from posprobe.errors import PosprobeError

        raise PosprobeError(
            f"the query experts of '{ctx.source.name}' layer {layer} have shape {experts.shape}, not "
            f"({router.shape[0]}, {s.heads // top_k * s.head_dim}, {s.hidden})",
            config_hint(ctx.source.name, MIXED_HINT),
        )
    picked = routed_experts(x @ router.T, top_k)  # (m, top_k)
    queries = np.einsum("md,eod->meo", x, experts)  # (m, E, H_kv d_h): every expert's query of every row
    q = np.take_along_axis(queries, picked[:, :, None], axis=1)  # (m, top_k, H_kv d_h)
    q = q.reshape(x.shape[0], s.heads, s.head_dim).transpose(1, 0, 2)  # head h = slot * H_kv + key head
    w, b = ctx.linear(f.key, layer)  # [k; v] rows
    kv_heads = s.heads // top_k
    k = (x @ w[: kv_heads * s.head_dim].T + b[: kv_heads * s.head_dim]).reshape(x.shape[0], kv_heads, s.head_dim)
    return q, np.tile(k.transpose(1, 0, 2), (top_k, 1, 1))
