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

With L2-clipped q/k (`tensors['qk_clip']`, Inkling 2: `clipped_scores`) q, k and the relative states are scaled
down to a maximum L2 norm per head, the keys' convolution is normalised and input-conditioned in full layers, each
layer after the first reads a depth-wise attention mix of earlier blocks' states (`depth_mixed_input`), and each
head's sink logit is a projection of the query's input (`sink_logits`); SPEC §9.
"""

from __future__ import annotations

import numpy as np

from posprobe.errors import PosprobeError
from posprobe.families.context import head_products
from posprobe.families.loops import loop_depth

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
    types, stored = list(getattr(ctx.transformers_config, "layer_types", None) or []), ctx.stored_layer(layer)
    return stored < len(types) and types[stored] == SLIDING


def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder", inputs=None) -> np.ndarray:
    """F_hat (H, n, n): row i = query position, column j = key position; `inputs`: data-conditioned layer inputs
    (`LayerInputs`) or None. A family with L2-clipped q/k (`tensors['qk_clip']`) reads as `clipped_scores`."""
    if "qk_clip" in ctx.family.tensors:
        return clipped_scores(ctx, layer, n, stack, inputs)
    f, heads, stored = ctx.family, ctx.shape.heads, ctx.stored_layer(layer)
    _check_sliding_heads(ctx, layer)
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


def _check_sliding_heads(ctx, layer: int) -> None:
    """Refuse a sliding layer whose query-head count (swa_num_attention_heads) is not the model's."""
    heads, cfg = ctx.shape.heads, ctx.transformers_config
    if _sliding(ctx, layer) and getattr(cfg, "swa_num_attention_heads", heads) != heads:
        raise PosprobeError(
            f"'{ctx.source.name}' has {cfg.swa_num_attention_heads} query heads in its sliding layers and {heads} in "
            "the others; posprobe's score matrices take one head count for every layer",
            "posprobe reads Inkling configs whose swa_num_attention_heads equals num_attention_heads",
        )


def l2_clipped(x: np.ndarray, threshold: float, scale: np.ndarray | None = None) -> np.ndarray:
    """Head vectors x (H, ..., d), times a learned scale (H, d) where given, scaled down to L2 norm `threshold`
    where longer: x * min(threshold / (|x| + 1e-6), 1) (shorter vectors unchanged)."""
    if scale is not None:
        x = x * scale.reshape(scale.shape[0], *([1] * (x.ndim - 2)), scale.shape[1])
    return x * np.minimum(threshold / (np.linalg.norm(x, axis=-1, keepdims=True) + 1e-6), 1.0)


def dynamic_convolved(u: np.ndarray, static: np.ndarray, dynamic: np.ndarray) -> np.ndarray:
    """Rows u (n, C) through a causal depthwise convolution whose tap t (lag t: t = 0 the row itself) is the
    static weight static[t] (K, C) plus, per key head g of C / H_kv channels, the row's own dynamic weight
    dynamic[:, g, t] (n, H_kv, K); with the residual, over sqrt(2K + 1) (zero before position 0)."""
    n, channels = u.shape
    taps, heads = static.shape[0], dynamic.shape[1]
    weights = static[None] + np.repeat(dynamic, channels // heads, axis=1).transpose(0, 2, 1)  # (n, K, C)
    out = u.copy()
    for lag in range(taps):
        out[lag:] += weights[lag:, lag] * u[: n - lag]
    return out / np.sqrt(2 * taps + 1)


def depth_mixed_input(ctx, layer: int) -> np.ndarray:
    """The content-free row (1, d) a layer's depth-wise attention over blocks hands its projections' norms
    (`tensors['depth_mix']`: every layer after the first): layer 0 reads the embedding-level input x; a later layer
    mixes the unweighted RMS norms (eps 1e-6) of the earlier blocks' states and of its own input, each x in a
    content-free run (every layer reads x, SPEC §9), so softmax weights summing to 1 give x / sqrt(mean(x^2) +
    1e-6), whatever the mix's learned queries."""
    x = ctx.embedding_rows()
    if ctx.stored_layer(layer) == 0 or "depth_mix" not in ctx.family.tensors:
        return x
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)


def message_gated(ctx, u: np.ndarray, gate: str, stored: int, stack: str = "encoder") -> np.ndarray:
    """Rows u (m, d) through a looped layer's message gate (prefix `gate`) whose message is u as well, as on the
    content-free input: (1 - tanh(z W_F^T) + tanh(z W_M^T)) * u with z = [n(u); n(u)] W_down^T, n an unweighted RMS
    norm with the config's epsilon."""
    normed = u / np.sqrt((u**2).mean(-1, keepdims=True) + ctx.shape.eps)
    z = np.concatenate([normed, normed], -1) @ ctx.tensor(gate + ".(down_proj.weight|down_weight)", stored, stack).T
    forget = np.tanh(z @ ctx.tensor(gate + ".(forget_gate_proj.weight|forget_weight)", stored, stack).T)
    message = np.tanh(z @ ctx.tensor(gate + ".(message_gate_proj.weight|gain_weight)", stored, stack).T)
    return (1 - forget) * u + message * u


def _clipped_inputs(ctx, layer: int, stack: str, inputs) -> tuple[np.ndarray, np.ndarray]:
    """(query rows, key rows), each (1, d): the depth-mixed input, in a looped layer's later passes through its
    query and key message gates (`tensors['query_message_gate']`, `['key_message_gate']`: the earlier pass's message
    is that input too), through the layer's query norm (`pre_norm`) and its key norm (`tensors['key_norm']`, full
    layers; sliding layers have one norm)."""
    if inputs is not None:
        raise PosprobeError(
            f"'{ctx.source.name}' ({ctx.source.model_type}) feeds each layer an attention mix over earlier blocks' "
            "states, which one mean hidden state does not give, so its layers cannot read inputs from text",
            "drop --text (texts=) for its content-free scores (SPEC §9)",
        )
    f, stored = ctx.family, ctx.stored_layer(layer)
    x_q = x_k = depth_mixed_input(ctx, layer)
    if "loop" in f.tensors and loop_depth(ctx, layer)[1] > 0:
        x_q = message_gated(ctx, x_q, f.tensors["query_message_gate"], stored, stack)
        x_k = message_gated(ctx, x_k, f.tensors["key_message_gate"], stored, stack)
    key_norm = f.pre_norm if _sliding(ctx, layer) else f.tensors["key_norm"]
    return ctx.norm(x_q, f.pre_norm, stored, stack), ctx.norm(x_k, key_norm, stored, stack)


def clipped_scores(ctx, layer: int, n: int, stack: str = "encoder", inputs=None) -> np.ndarray:
    """F_hat (H, n, n) of relative logits with L2-clipped q/k and input-conditioned key convolutions (SPEC §9):
    q_h = clip(s_q[h] * (y_q W_Q)_h), k_g = clip(conv((y_k W_K))_g) (a static convolution in sliding layers, a
    dynamic one in full layers: `dynamic_convolved`, taps from y_k), r_h = clip(s_r[h] * (y_q W_R)_h),
    F_hat(i, j) = tau(i) (q_h . k_g(j) / sqrt(d_h) + r_h . P[:, i - j]); y_q, y_k from `_clipped_inputs`."""
    f, heads, stored, names = ctx.family, ctx.shape.heads, ctx.stored_layer(layer), ctx.family.tensors
    _check_sliding_heads(ctx, layer)
    cfg = ctx.transformers_config
    y_q, y_k = (np.broadcast_to(rows, (n, ctx.shape.hidden)) for rows in _clipped_inputs(ctx, layer, stack, inputs))
    wq, _ = ctx.linear(f.query, stored, stack)
    wk, _ = ctx.linear(f.key, stored, stack)
    head_dim, threshold = wq.shape[0] // heads, float(getattr(cfg, names["qk_clip"]))
    q = (y_q @ wq.T).reshape(n, heads, head_dim).transpose(1, 0, 2)  # (H, n, d_h)
    q = l2_clipped(q, threshold, ctx.tensor(names["query_scale"], stored, stack))
    u = y_k @ wk.T
    if _sliding(ctx, layer):
        taps = ctx.tensor(names["key_convolution"], stored, stack)
        u = convolved(u, taps) / np.sqrt(taps.shape[-1] + 1)
    else:
        static = ctx.tensor(names["key_static_taps"], stored, stack)
        dynamic = y_k @ ctx.tensor(names["key_dynamic_taps"], stored, stack).T
        u = dynamic_convolved(u, static, dynamic.reshape(n, -1, static.shape[0]))
    k = l2_clipped(u.reshape(n, -1, head_dim).transpose(1, 0, 2), threshold)  # (H_kv, n, d_h)
    states = (y_q @ ctx.tensor(names["relative_states"], stored, stack).T).reshape(n, heads, -1)
    states = l2_clipped(states.transpose(1, 0, 2), float(getattr(cfg, names["relative_clip"])),
                        ctx.tensor(names["relative_scale"], stored, stack))  # fmt: skip
    bias = relative_bias(states, ctx.tensor(names["relative_profiles"], stored, stack))
    scores = head_products(q, k) * head_dim**-0.5 + bias
    tau = log_scale(ctx, layer, n)
    return scores if tau is None else scores * tau[:, None]


def sink_logits(ctx, layer: int, stack: str = "encoder") -> np.ndarray:
    """(H,) a layer's input-conditioned sink logits on the content-free input: s_h = (y_q W_S)_h, the same for every
    query (the Linear `tensors['sink_projection']` of the query rows `_clipped_inputs` gives)."""
    y_q = _clipped_inputs(ctx, layer, stack, None)[0][0]
    return ctx.tensor(ctx.family.tensors["sink_projection"], ctx.stored_layer(layer), stack) @ y_q


def toeplitz_by_construction(ctx, stack: str = "encoder", conditioned: bool = False) -> bool:
    """Never: the convolved keys of the first K - 1 positions differ from the rest even for a constant input (and
    log scaling makes full layers depend on the query's position)."""
    return False
