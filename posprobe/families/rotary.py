"""Content-free scores of rotary (RoPE) families (SPEC §9): F_hat(i, j) = (R_i q) . (R_j k) * scaling.

Shapes: H query heads, H_kv key heads (query head h reads key head h // (H / H_kv)), d_h head size, r <= d_h
rotated dimensions (partial rotary: the first r dims rotate, the rest pass through), n positions.
The rotation angles come from the family's own transformers rotary module (`Family.rotary_class`), built from
the checkpoint's config: its rope initialisation gives the frequencies and the attention scaling of every
`rope_type` (default, linear, dynamic, yarn, longrope, llama3, ...), in the precision the model uses; where the
module keeps one setting per layer type (Gemma 3's local and global layers, ModernBERT) each layer gets its
own. The module holds no weights; no model is built. How the angles pair the dims is the family's
`rotary_layout` (`table.ROTARY_LAYOUTS`): transformers' `rotate_half` (dim i with i + r/2), or interleaved pairs
(2i, 2i + 1: GPT-J, CodeGen, RoFormer, GLM, Cohere), which are read as rotate_half pairs of the same
permutation of q's and k's dims (a dot product does not change when both are permuted alike).
"""

from __future__ import annotations

import importlib

import numpy as np

from posprobe.architectures import table as T
from posprobe.errors import PosprobeError
from posprobe.families.windows import layer_thetas, rope_setting, takes_layer_type


def transformers_config(ctx):
    """The checkpoint's config as its transformers config class (rope_scaling etc. normalised by it)."""
    from transformers import AutoConfig

    config = {k: _floats(v) for k, v in ctx.config.items() if k not in ("model_type", "transformers_version")}
    try:
        return AutoConfig.for_model(ctx.source.language_model or ctx.source.model_type, **config)
    except Exception as err:  # config classes validate rope parameters with several exception types
        raise PosprobeError(
            f"transformers refuses the config of '{ctx.source.name}': {str(err).splitlines()[0][:200]}",
            "fix config.json (rope_scaling / rope_parameters) or re-save the checkpoint",
        ) from err


def _floats(value):
    """A config value with transformers' JSON spelling of non-finite floats ({"__float__": "Infinity"}, written by
    `save_pretrained`: Bamba's time_step_limit) turned back into floats."""
    if isinstance(value, dict):
        if set(value) == {"__float__"}:
            return float(value["__float__"])
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return value


def rotary_angles(
    ctx, n: int, layer_type: str | None = None, theta: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), each (n, r) float64, exactly as the family's rotary module gives them for positions 0..n-1
    (attention scaling of yarn / longrope included; `layer_type` for modules with one setting per layer type;
    `theta` a layer's own rope base, for families with one per layer: the module built at that base, as the
    model builds one per base), in rotate_half order: dims i and i + r/2 form a pair (interleaved layouts are
    reordered, see `pairing`)."""
    plain = default_rope_angles(ctx, n, layer_type, theta)
    if plain is not None:
        return plain
    import torch

    f = ctx.family
    module_name, class_name = f.rotary_class.split(":")
    rotary_class = getattr(importlib.import_module(module_name), class_name)
    with torch.no_grad():
        if f.rotary_layout == T.SIN_COS_TABLE:  # a [sin | cos] position table: stored, or built by the module
            table = _rotary_table(ctx, rotary_class, n)
            sin, cos = np.split(table, 2, axis=-1)
            return np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)
        rotary = rotary_class(config=ctx.transformers_config if theta is None else _with_theta(ctx, theta))
        x = torch.zeros(1, n, 1, dtype=torch.float64)
        extra = {} if layer_type is None else {"layer_type": layer_type}
        angles = rotary(x, torch.arange(n)[None], **extra)
    layout = T.rotary_layout(f, ctx.config)
    if layout == T.COMPLEX:  # e^{i angle} per pair (n, r/2), dims 2i, 2i + 1
        angles = angles[0].cdouble().numpy()
        return np.concatenate([angles.real, angles.real], -1), np.concatenate([angles.imag, angles.imag], -1)
    first, second = angles[0][0].double().numpy(), angles[1][0].double().numpy()
    if layout == T.ROTATE_HALF:
        return first, second
    if layout == T.REVERSED:  # NanoChat's rotate_half with flipped signs: sin(-angle)
        return first, -second
    if layout == T.HALF_ANGLES:  # one column per pair, pairs (i, i + r/2): already rotate_half order
        return np.concatenate([first, first], -1), np.concatenate([second, second], -1)
    if layout == T.SIN_COS_PAIRS:  # (sin, cos), one column per pair
        cos, sin = second, first
    elif layout == T.INTERLEAVED:  # each pair's angle repeated: columns 2i, 2i + 1
        cos, sin = first[:, ::2], second[:, ::2]
    else:  # HALF_INTERLEAVED: the first half of rotate_half-ordered angles, each repeated for a pair
        cos, sin = first[:, : first.shape[1] // 2], second[:, : second.shape[1] // 2]
    return np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)


# rotary modules that compute the original RoPE exactly as Llama's does for rope_type 'default' (inv_freq =
# 1 / theta^(2i/d) in float32, angles = position * inv_freq in float32, their cos and sin, attention scaling 1,
# all of head_dim rotated): `default_rope_angles` gives their angles without importing torch or transformers;
# tests/test_rotary_bands.py checks it against each module
DEFAULT_ROPE_MODULES = frozenset({
    "transformers.models.llama.modeling_llama:LlamaRotaryEmbedding",
    "transformers.models.mistral.modeling_mistral:MistralRotaryEmbedding",
    "transformers.models.qwen2.modeling_qwen2:Qwen2RotaryEmbedding",
    "transformers.models.qwen3.modeling_qwen3:Qwen3RotaryEmbedding",
})  # fmt: skip


def default_rope_angles(ctx, n: int, layer_type: str | None = None, theta: float | None = None):
    """`rotary_angles` in numpy for the modules of `DEFAULT_ROPE_MODULES` when the checkpoint's own config.json asks
    for the original RoPE (rope_type 'default' or no rope_scaling, its rope_theta stated, no partial rotary), else
    None (the module is built). The float32 steps are the module's (inverse frequencies and angles equal to
    torch's bit for bit); cos and sin are rounded to float32 from float64 (within one float32 unit of torch's)."""
    found = default_rope_inv_freq(ctx, layer_type, theta)
    if found is None:
        return None
    inv_freq = found[1]
    freqs = np.arange(n, dtype=np.float32)[:, None] * inv_freq[None, :]  # (n, dim/2) float32
    angles = np.concatenate([freqs, freqs], axis=-1).astype(np.float64)
    return np.cos(angles).astype(np.float32).astype(np.float64), np.sin(angles).astype(np.float32).astype(np.float64)


def default_rope_inv_freq(ctx, layer_type: str | None = None, theta: float | None = None):
    """(base, inv_freq (dim/2,) float32) of the original RoPE as a module of `DEFAULT_ROPE_MODULES` builds it from
    the checkpoint's config.json (see `default_rope_angles`), or None where the module must be built."""
    config, f = ctx.config, ctx.family
    if f.rotary_class not in DEFAULT_ROPE_MODULES or layer_type is not None:
        return None
    if T.rotary_layout(f, config) != T.ROTATE_HALF or config.get("partial_rotary_factor") not in (None, 1, 1.0):
        return None
    params = config.get("rope_parameters")
    if params is not None:  # transformers 5's spelling: one flat dict
        if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
            return None
        if params.get("rope_type", "default") != "default" or params.get("partial_rotary_factor") not in (None, 1, 1.0):
            return None
        base = params.get("rope_theta", config.get("rope_theta"))
    else:  # the older spelling: rope_theta, and rope_scaling null for the original RoPE
        if config.get("rope_scaling") is not None:
            return None
        base = config.get("rope_theta")
    base = theta if theta is not None else base
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    dim = config.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) else None)
    if not isinstance(base, (int, float)) or isinstance(base, bool) or base <= 0 or not isinstance(dim, int):
        return None
    exponent = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    # torch raises a Python float to a float32 tensor as float64 rounded to float32 (equal here bit for bit)
    inv_freq = np.float32(1.0) / (np.float64(base) ** exponent.astype(np.float64)).astype(np.float32)  # (dim/2,)
    return float(base), inv_freq


def _with_theta(ctx, theta: float):
    """The checkpoint's transformers config with rope base `theta` in its rope parameters (a copy)."""
    import copy

    config = copy.deepcopy(ctx.transformers_config)
    config.rope_parameters = {**config.rope_parameters, "rope_theta": theta}
    return config


def layer_rotary(ctx, layer: int, n: int, stack: str = "encoder") -> tuple[str | None, float | None]:
    """(layer type, rope base) that pick layer `layer`'s rotary setting: its layer type for modules with one
    setting per type (Gemma 3, ModernBERT), its own base for families with one per layer (Granite SWA); None
    where the model's one setting applies."""
    kinds = ctx.layer_kinds(n, stack)
    layer_type = rope_setting(ctx, kinds[layer].layer_type) if takes_layer_type(ctx) else None
    if kinds[layer].nope and layer_type is not None and ctx.transformers_config.rope_parameters.get(layer_type) is None:
        # a NoPE layer type without rope parameters (Cohere Compass) has no angles: the first rotary type's
        layer_type = next((k.layer_type for k in kinds if not k.nope), layer_type)
    thetas = layer_thetas(ctx, layer + 1)
    return layer_type, (thetas[layer] if layer < len(thetas) and thetas[layer] else None)


def _rotary_table(ctx, rotary_class, n: int) -> np.ndarray:
    """RoFormer's sinusoidal table (n, d_h) of [sin | cos]: the checkpoint's own where stored, else built."""
    stored = ctx.optional(ctx.family.tensors["rotary_table"])
    if stored is not None:
        if stored.shape[0] < n or stored.shape[1] % 2:
            raise PosprobeError(
                f"the rotary table of '{ctx.source.name}' has shape {stored.shape}, too small for {n} positions",
                "analyse fewer positions with --positions, or re-save the checkpoint",
            )
        return stored[:n]
    return rotary_class(n, ctx.shape.head_dim).create_weight().double().numpy()


def pairing(layout: str, d_h: int, r: int) -> np.ndarray | None:
    """The permutation of a head's dims that turns the layout's pairs into rotate_half pairs (i, i + r/2), or
    None for rotate_half itself: interleaved pairs (2i, 2i + 1) -> even dims first, then odd, then the rest."""
    if layout in (T.ROTATE_HALF, T.HALF_ANGLES, T.REVERSED):
        return None
    return np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2), np.arange(r, d_h)])


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Vectors x (G, d_h), the same at every position, or (G, n, d_h), one per position, rotated to their
    positions: (G, n, d_h), the first r = cos.shape[-1] dims rotated."""
    n, r = cos.shape
    x = np.broadcast_to(x[:, None, :] if x.ndim == 2 else x, (x.shape[0], n, x.shape[-1]))
    rot, rest = x[..., :r], x[..., r:]
    half = r // 2
    rotated = rot * cos + np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1) * sin  # rotate_half
    return np.concatenate([rotated, rest], axis=-1)


def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder", inputs=None) -> np.ndarray:
    """F_hat (H, n, n): row i = query position, column j = key position (k = j - i); `inputs`: data-conditioned
    layer inputs (`LayerInputs`) or None."""
    if ctx.qkv == T.CCA and inputs is None:  # q and k mixed along the sequence (ZAYA): one per position
        inputs = ctx.layer_inputs({layer: np.repeat(ctx.embedding_rows(), n, axis=0)})
    q, k = ctx.query_key(layer, stack, inputs)  # (H, d_h), (H_kv, d_h); or (H, n, d_h), (H_kv, n, d_h) per position
    kind = ctx.layer_kinds(n, stack)[layer]
    if kind.nope:  # a NoPE layer: no rotation, F̂(i, j) = q_i . k_j * scaling (one value for a constant input)
        if ctx.family.qk_norm_after_rotary:
            q, k = ctx.qk_norm(q, k, layer, stack)
        scores = nope_scores(q * ctx.layer_scaling(layer), k, n)
        temperature = query_temperature(ctx, n)
        return ctx.softcap(scores if temperature is None else scores * temperature[:, None])
    setting = layer_rotary(ctx, layer, n, stack)
    if ("rotary", n, setting) not in ctx.cache:  # the same angles for every layer (of a type, of a base)
        ctx.cache["rotary", n, setting] = rotary_angles(ctx, n, *setting)
    cos, sin = ctx.cache["rotary", n, setting]
    if cos.shape[-1] > q.shape[-1] or cos.shape[-1] % 2:
        raise PosprobeError(
            f"the rotary module of '{ctx.source.name}' rotates {cos.shape[-1]} dims of {q.shape[-1]}-dim heads",
            "the config is malformed; re-save the checkpoint",
        )
    order = pairing(T.rotary_layout(ctx.family, ctx.config), q.shape[-1], cos.shape[-1])
    if order is not None:
        q, k = q[..., order], k[..., order]
    heads, kv_heads, dh = q.shape[0], k.shape[0], q.shape[-1]
    qr = rotate(q, cos, sin)  # (H, n, d_h)
    kr = rotate(k, cos, sin)  # (H_kv, n, d_h)
    eps = post_rotary_norm_eps(ctx)
    if eps is not None:  # Llama 4: an RMS ("L2") norm without weights of the rotated q and k
        qr, kr = (x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) for x in (qr, kr))
    if "unit_qk" in ctx.family.tensors:  # Dory (nGPT): q and k on the unit sphere (rotating keeps their norm)
        qr, kr = (x / np.sqrt((x**2).sum(-1, keepdims=True) + ctx.shape.eps) for x in (qr, kr))
    scale = query_channel_scale(ctx, layer, stack)
    if scale is not None:  # Dory: each channel of the rotated query rescaled (stored in the model's own dim order)
        qr = qr * (scale if order is None else scale[..., order])
    if ctx.family.qk_norm_after_rotary:  # Hunyuan: the family's q/k norms (with weights) of the rotated q and k
        if order is not None:  # the norms' weights are stored in the model's own dim order
            inverse = np.argsort(order)
            qr, kr = ctx.qk_norm(qr[..., inverse], kr[..., inverse], layer, stack)
            qr, kr = qr[..., order], kr[..., order]
        else:
            qr, kr = ctx.qk_norm(qr, kr, layer, stack)
    qr = qr * ctx.layer_scaling(layer)
    # Query heads h = g * m .. g * m + m - 1 read key head g: one (m n, d_h) x (d_h, n) product per group.
    grouped = qr.reshape(kv_heads, (heads // kv_heads) * n, dh)
    scores = grouped @ np.ascontiguousarray(kr.transpose(0, 2, 1))  # (H_kv, m n, n)
    scores = ctx.softcap(scores.reshape(heads, n, n))
    if "dt_proj" in ctx.family.tensors:  # Doge: a bias from each key's value (families.dynamic_mask)
        from posprobe.families.dynamic_mask import key_bias

        x = np.atleast_2d(ctx.word_input(layer, stack, inputs))
        scores = scores + key_bias(ctx, ctx.stored_layer(layer), x, heads)
    return scores


def query_channel_scale(ctx, layer: int, stack: str = "encoder") -> np.ndarray | None:
    """(H, 1, d_h) the factor Dory multiplies each channel of the rotated query by, (sqk * sqrt(d_h) /
    initializer_range)^2 from the layer's stored sqk (H d_h,), in the model's own dim order; else None."""
    name = ctx.family.tensors.get("query_channel_scale")
    if not name:
        return None
    sqk = ctx.tensor(name, ctx.stored_layer(layer), stack)
    factor = ctx.shape.head_dim**0.5 / float(ctx.transformers_config.initializer_range)
    return ((sqk * factor) ** 2).reshape(ctx.shape.heads, 1, ctx.shape.head_dim)


def post_rotary_norm_eps(ctx) -> float | None:
    """The epsilon of a weightless RMS norm the family applies to rotated q and k (Llama 4's qk L2 norm, on its
    rotary layers when config.use_qk_norm; NanoChat's 'always'), else None."""
    key = ctx.family.tensors.get("post_rotary_l2_norm")
    return ctx.shape.eps if key and (key == "always" or T.config_flag(ctx.config, key)) else None


def query_temperature(ctx, n: int) -> np.ndarray | None:
    """(n,) the factor a NoPE layer multiplies the query at position i by (Llama 4's attention temperature tuning:
    1 + attn_scale * log(1 + floor((i + 1) / floor_scale)), in float32 as the model computes it; Beam's
    (1 + (i + 1) / 2048) ** 0.1, by its own function `Family.tensors['nope_query_scale']`), else None."""
    import torch

    function = ctx.family.tensors.get("nope_query_scale")
    if function:  # the family's own function of the positions (Beam's scalable-softmax scale, in float32)
        module, name = function.split(":")
        scale = getattr(importlib.import_module(module), name)(torch.arange(n)[None])
        return scale.double().numpy().reshape(n)
    key = ctx.family.tensors.get("temperature_tuning")
    if not key or not T.config_flag(ctx.config, key):
        return None
    cfg = ctx.transformers_config
    positions = torch.arange(n, dtype=torch.float32)
    scales = torch.log1p(torch.floor((positions + 1.0) / cfg.floor_scale)) * cfg.attn_scale + 1.0
    return scales.double().numpy()


def nope_scores(q: np.ndarray, k: np.ndarray, n: int) -> np.ndarray:
    """q . k of a layer without a positional mechanism, (H, n, n): q (H, d_h) and k (H_kv, d_h) give the same
    value at every pair (the layer's content-free score carries no position); per-position q (H, n, d_h) and
    k (H_kv, n, d_h) give q_i . k_j (grouped-query heads read their key head)."""
    k = np.repeat(k, q.shape[0] // k.shape[0], axis=0)
    if q.ndim == 2:
        return np.broadcast_to((q * k).sum(-1)[:, None, None], (q.shape[0], n, n)).copy()
    return q @ k.transpose(0, 2, 1)


def toeplitz_by_construction(ctx, stack: str = "encoder", conditioned: bool = False) -> bool:
    """Always, for an input that is the same at every position: (R_i q) . (R_j k) = q . R_{j-i} k depends on
    j - i alone (a soft cap applied after keeps that), so R^2 = 1 whatever the weights; a NoPE layer's scores are
    one constant, trivially Toeplitz — unless its queries are scaled by their position (Llama 4's temperature
    tuning), which makes them depend on i as well, or weighted norms act on the rotated q and k (Hunyuan: their
    weights need not be the same within a rotated pair), or the rotated query is rescaled per channel (Dory), or q
    and k come from convolutions along the sequence (ZAYA)."""
    if ctx.family.qk_norm_after_rotary and ctx.switched_on("qk_norm"):
        return False
    if ctx.qkv == T.CCA:  # convolutions along the sequence: the first positions' q and k differ (ZAYA)
        return False
    if "query_channel_scale" in ctx.family.tensors:  # Dory: a rotated pair's two channels scaled apart
        return False
    key = ctx.family.tensors.get("temperature_tuning")
    scaled = (key and T.config_flag(ctx.config, key)) or "nope_query_scale" in ctx.family.tensors
    return not (scaled and ctx.layer_kinds(1, stack) and _has_nope(ctx, stack))


def _has_nope(ctx, stack: str) -> bool:
    return any(kind.nope for kind in ctx.layer_kinds(1, stack))
