"""Multi-head latent attention (MLA: DeepSeek V2 / V3): each head's query and key split into a rotary part and a
position-free part.

For a layer input x (d,) (after the layer's input norm), with r = qk_rope_head_dim rotated dims and p =
qk_nope_head_dim position-free dims per head:
- query per head h: q_h = x W_q (or, with a query LoRA, RMSNorm(x W_qa + b_qa) W_qb; AXK2: [RMSNorm(c); c] W_qb
  with c = x W_qa, each head's rows [q_h; output gate_h]), split [q_pass (p) | q_rot (r)];
- one shared compressed vector c = x W_kva + b_kva, split [latent (kv_lora_rank) | k_rot (r)]; the latent goes
  through its RMSNorm and W_kvb to give each head's [k_pass (p) | value]; k_rot is the same for every head.
F̂(i, j) = scaling * (q_pass . k_pass + (R_i q_rot) . (R_j k_rot)): the first term does not depend on position (one
constant for the constant input of SPEC §9), the second is an ordinary rotary score. `query_key` returns q and k
with the rotary part FIRST ([q_rot | q_pass], [k_rot | k_pass], H heads each): a dot product does not change when
both are permuted alike, and posprobe's rotary code rotates the leading r dims (partial rotary), so every rotary
analysis (F̂, profiles, bands) sees MLA's rotary part as the rotated dims and its position-free part as the rest.

Shapes: H heads, d hidden, n positions; `ctx` a `posprobe.families.context.ModelContext`.
"""

from __future__ import annotations

import importlib

import numpy as np

from posprobe.families.embeddings import apply_norm


def _attention(ctx) -> str:
    """The attention module's prefix, 'layers.{l}.self_attn.' (or the alternatives the family names): its `key`
    less the projection's own name."""
    return ctx.family.key.rsplit(".", 1)[0] + "."


def latent_sizes(config: dict) -> tuple[int, int, int]:
    """(rotary dims r, position-free dims p, kv_lora_rank) of an MLA config."""
    return int(config["qk_rope_head_dim"]), int(config["qk_nope_head_dim"]), int(config["kv_lora_rank"])


def _prefix(ctx) -> str:
    """Where the layer's MLA block lives (`Family.tensors['latent_prefix']`; LongCat-Flash: one per sublayer)."""
    return ctx.family.tensors.get("latent_prefix") or _attention(ctx)


def _linear(ctx, name: str, layer: int, x: np.ndarray) -> np.ndarray:
    w, b = ctx.linear(_prefix(ctx) + name, layer)
    return x @ w.T + b


def _rms(ctx, name: str, layer: int, x: np.ndarray) -> np.ndarray:
    """The MLA block's own RMSNorms (q_a_layernorm, kv_a_layernorm; epsilon 1e-6 as their modules fix it)."""
    return apply_norm(x, "rmsnorm", ctx.tensor(_prefix(ctx) + name + ".weight", layer), None, 1e-6)


def lora_scales(ctx) -> tuple[float, float]:
    """(query factor, position-free key factor): LongCat-Flash multiplies q by sqrt(d / q_lora_rank) and k_pass by
    sqrt(d / kv_lora_rank) (`Family.tensors['latent_lora_scale']`); 1 and 1 elsewhere."""
    if "latent_lora_scale" not in ctx.family.tensors:
        return 1.0, 1.0
    d = ctx.shape.hidden
    return (d / int(ctx.config["q_lora_rank"])) ** 0.5, (d / int(ctx.config["kv_lora_rank"])) ** 0.5


def latent_query_key(ctx, x: np.ndarray, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """Queries and keys of layer-input rows x (m, d) as (H, m, r + p) each, rotary part first (see the module)."""
    r, p, rank = latent_sizes(ctx.config)
    heads = ctx.shape.heads
    if ctx.key(_prefix(ctx) + "q_a_proj.weight", layer) is not None:  # query LoRA (DeepSeek V2 / V3 releases)
        latent_q = _linear(ctx, "q_a_proj", layer, x)
        normed = _rms(ctx, "q_a_layernorm", layer, latent_q)
        w, b = ctx.linear(_prefix(ctx) + "(q_b_proj|q_gate_proj)", layer)
        if w.shape[1] == 2 * normed.shape[-1]:  # AXK2: [normed latent; latent] -> each head's [q_h; output gate_h]
            both = np.concatenate([normed, latent_q], -1) @ w.T + b
            q = both.reshape(x.shape[0], heads, -1)[..., : p + r].reshape(x.shape[0], -1)  # the gate rows dropped
        else:
            q = normed @ w.T + b
    else:
        q = _linear(ctx, "q_proj", layer, x)
    q = q.reshape(x.shape[0], heads, p + r).transpose(1, 0, 2)  # (H, m, p + r)
    compressed = _linear(ctx, "kv_a_proj_with_mqa", layer, x)  # (m, rank + r)
    latent, k_rot = compressed[:, :rank], compressed[:, rank:]
    kv = _linear(ctx, "kv_b_proj", layer, _rms(ctx, "kv_a_layernorm", layer, latent))  # (m, H (p + v))
    k_pass = kv.reshape(x.shape[0], heads, -1)[..., :p].transpose(1, 0, 2)  # (H, m, p)
    k_rot = np.broadcast_to(k_rot[None], (heads, *k_rot.shape))
    q_scale, k_scale = lora_scales(ctx)
    q, k_pass = q * q_scale, k_pass * k_scale
    return np.concatenate([q[..., p:], q[..., :p]], -1), np.concatenate([k_rot, k_pass], -1)


def latent_scaling(ctx) -> float:
    """The module's own score scale: (r + p) ** -0.5, times YaRN's mscale² where its rope parameters ask
    (the family's `yarn_apply_mscale`, named in `Family.tensors['scaling_function']`)."""
    r, p, _ = latent_sizes(ctx.config)
    module, name = ctx.family.tensors["scaling_function"].split(":")
    apply_mscale = getattr(importlib.import_module(module), name)
    return float(apply_mscale(ctx.transformers_config.rope_parameters, (r + p) ** -0.5))
