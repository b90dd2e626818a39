"""Content-free scores of relative logits conditioned on the hidden state, over convolved keys (Inkling; SPEC §9).

No rotary embedding. For layer input rows y (after the layer's input norm), H query heads of size d_h (key head
g = h // (H / H_kv) for query head h; a layer's own key head count and head size are read from its weights):
- q_h(i) = RMSNorm_q(y(i) W_Q[h]) (per-head norm);
- key channels u(j) = y(j) W_K go through the layer's short causal depthwise convolution with a residual,
  c(j) = u(j) + sum_t w[:, t] u(j - (K - 1) + t) (zero before position 0), and k_g(j) = RMSNorm_k(c(j)[g]);
- relative states r_h(i) = (y(i) W_R)_h (d_rel) mix a learned bank P (d_rel, extent) of per-distance profiles:
  bias_h(i, j) = r_h(i) . P[:, i - j] for 0 <= i - j < extent, else 0 (extent: the window in sliding layers);
- full layers with `log_scaling_n_floor` scale query and bias at position i by
  tau(i) = 1 + log_scaling_alpha * log(max((i + 1) / log_scaling_n_floor, 1)) (float32, as the model).
F̂(i, j) = tau(i) (q_h(i) . k_g(j) / d_h + bias_h(i, j)). On the constant input of SPEC §9 the convolution still
makes the first K - 1 keys differ from the rest (fewer taps see a token), so F̂ is not Toeplitz by construction.

Names (`Family.tensors`): 'relative_states' (Linear W_R), 'relative_profiles' (P), 'key_convolution' (w (C, 1, K));
`ctx` a `posprobe.families.context.ModelContext`.
"""

from __future__ import annotations

import numpy as np

from posprobe.errors import PosprobeError
from posprobe.families.context import head_products

SLIDING = "hybrid_sliding"  # the config's layer type of a sliding-window layer


def convolved(u: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Rows u (n, C) through a causal depthwise convolution w (C, 1, K) plus the residual: (n, C)."""
    taps = weight.reshape(weight.shape[0], -1)
    out = u.copy()
    for t in range(taps.shape[1]):
        shift = taps.shape[1] - 1 - t  # tap t reads the position `shift` before
        out[shift:] += taps[:, t] * u[: u.shape[0] - shift]
    return out


def relative_bias(states: np.ndarray, profiles: np.ndarray) -> np.ndarray:
    """bias (H, n, n) of relative states (H, n, d_rel) and profiles (d_rel, extent): row i, column j holds
    states[:, i] . profiles[:, i - j] for 0 <= i - j < extent, else 0."""
    logits = states @ profiles  # (H, n, extent)
    n, extent = states.shape[1], profiles.shape[1]
    distance = np.arange(n)[:, None] - np.arange(n)[None, :]
    inside = (distance >= 0) & (distance < extent)
    gathered = np.take_along_axis(logits, np.broadcast_to(np.clip(distance, 0, extent - 1), logits.shape[:1] + (n, n)),
                                  axis=-1)  # fmt: skip
    return np.where(inside, gathered, 0.0)


def log_scale(ctx, layer: int, n: int) -> np.ndarray | None:
    """tau (n,) of a full layer when the config sets log_scaling_n_floor (float32, as the model), else None."""
    import torch

    cfg = ctx.transformers_config
    if _sliding(ctx, layer) or getattr(cfg, "log_scaling_n_floor", None) is None:
        return None
    positions = torch.arange(n, dtype=torch.float32) + 1.0
    tau = 1.0 + cfg.log_scaling_alpha * torch.log((positions / cfg.log_scaling_n_floor).clamp(min=1.0))
    return tau.double().numpy()


def _sliding(ctx, layer: int) -> bool:
    types = list(getattr(ctx.transformers_config, "layer_types", None) or [])
    return layer < len(types) and types[layer] == SLIDING


def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder", inputs=None) -> np.ndarray:
    """F_hat (H, n, n): row i = query position, column j = key position; `inputs`: data-conditioned layer inputs
    (`LayerInputs`) or None."""
    f, heads, stored = ctx.family, ctx.shape.heads, ctx.stored_layer(layer)
    cfg = ctx.transformers_config
    if _sliding(ctx, layer) and getattr(cfg, "swa_num_attention_heads", heads) != heads:
        raise PosprobeError(
            f"'{ctx.source.name}' has {cfg.swa_num_attention_heads} query heads in its sliding layers and {heads} in "
            "the others; posprobe's score matrices take one head count for every layer",
            "posprobe reads Inkling configs whose swa_num_attention_heads equals num_attention_heads",
        )
    y = np.broadcast_to(ctx.layer_rows(layer, stack, inputs=inputs), (n, ctx.shape.hidden))
    wq, bq = ctx.linear(f.query, stored, stack)
    wk, bk = ctx.linear(f.key, stored, stack)
    head_dim = wq.shape[0] // heads
    q = (y @ wq.T + bq).reshape(n, heads, head_dim).transpose(1, 0, 2)  # (H, n, d_h)
    keys = convolved(y @ wk.T + bk, ctx.tensor(f.tensors["key_convolution"], stored, stack))
    k = keys.reshape(n, -1, head_dim).transpose(1, 0, 2)  # (H_kv, n, d_h)
    q, k = ctx.qk_norm(q, k, layer, stack)
    wr, br = ctx.linear(f.tensors["relative_states"], stored, stack)
    states = (y @ wr.T + br).reshape(n, heads, -1).transpose(1, 0, 2)  # (H, n, d_rel)
    scores = head_products(q, k) / head_dim + relative_bias(states, ctx.tensor(f.tensors["relative_profiles"],
                                                                                stored, stack))  # fmt: skip
    tau = log_scale(ctx, layer, n)
    return scores if tau is None else scores * tau[:, None]


def toeplitz_by_construction(ctx, stack: str = "encoder", conditioned: bool = False) -> bool:
    """Never: the convolved keys of the first K - 1 positions differ from the rest even for a constant input (and
    log scaling makes full layers depend on the query's position)."""
    return False
