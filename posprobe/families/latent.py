"""Multi-head latent attention (MLA: DeepSeek V2 / V3): each head's query and key split into a rotary part and a
position-free part.

For a layer input x (d,) (after the layer's input norm), with r = qk_rope_head_dim rotated dims and p =
qk_nope_head_dim position-free dims per head:
- query per head h: q_h = x W_q (or, with a query LoRA, RMSNorm(x W_qa + b_qa) W_qb; AXK2: [RMSNorm(c); c] W_qb
  with c = x W_qa, each head's rows [q_h; output gate_h]), split [q_pass (p) | q_rot (r)];
- one shared compressed vector c = x W_kva + b_kva, split [latent (kv_lora_rank) | k_rot (r)]; the latent goes
  through its RMSNorm and W_kvb to give each head's [k_pass (p) | value]; k_rot is the same for every head.
Variants the family entry names: the normed latents multiplied by sqrt(d / rank) (`tensors['latent_lora_scale']`:
LongCat-Flash, Dots3), an RMS norm of the shared k_rot before its rotation (`tensors['rotary_key_norm']`: Dots3), the
block's norms at the config's epsilon (`tensors['latent_norm_eps']` 'config'), and sizes per layer (`tensors
['latent_sizes']` 'per_layer_config': each layer's heads, ranks and head dims from transformers' per_layer_config,
Dots3's sliding layers; a layer with fewer heads than the model's most has NaN scores for the others, SPEC §9).
F̂(i, j) = scaling * (q_pass . k_pass + (R_i q_rot) . (R_j k_rot)): the first term does not depend on position (one
constant for the constant input of SPEC §9), the second is an ordinary rotary score. `query_key` returns q and k
with the rotary part FIRST ([q_rot | q_pass], [k_rot | k_pass], H heads each): a dot product does not change when
both are permuted alike, and posprobe's rotary code rotates the leading r dims (partial rotary), so every rotary
analysis (F̂, profiles, bands) sees MLA's rotary part as the rotated dims and its position-free part as the rest.

Shapes: H heads, d hidden, n positions; `ctx` a `posprobe.families.context.ModelContext`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from posprobe.errors import PosprobeError
from posprobe.families.embeddings import apply_norm


def _attention(ctx) -> str:
    """The attention module's prefix, 'layers.{l}.self_attn.' (or the alternatives the family names): its `key`
    less the projection's own name."""
    return ctx.family.key.rsplit(".", 1)[0] + "."


def latent_sizes(config: dict) -> tuple[int, int, int]:
    """(rotary dims r, position-free dims p, kv_lora_rank) of an MLA config."""
    return int(config["qk_rope_head_dim"]), int(config["qk_nope_head_dim"]), int(config["kv_lora_rank"])


@dataclass(frozen=True)
class LatentSizes:
    """One layer's MLA sizes: query heads, rotary dims r, position-free dims p, and the two LoRA ranks (q_rank
    None where queries have no LoRA)."""

    heads: int
    rope: int
    nope: int
    kv_rank: int
    q_rank: int | None


def layer_sizes(ctx, layer: int) -> LatentSizes:
    """The MLA sizes of layer `layer`: the config's, or (`tensors['latent_sizes']` 'per_layer_config') the layer's
    own as transformers resolves them from per_layer_config (Dots3's sliding layers: heads, ranks, head dims).
    A layer with more heads than the model's count (config.num_attention_heads) is refused."""
    if ctx.family.tensors.get("latent_sizes") != "per_layer_config":
        r, p, rank = latent_sizes(ctx.config)
        q_rank = ctx.config.get("q_lora_rank")
        return LatentSizes(ctx.shape.heads, r, p, rank, None if q_rank is None else int(q_rank))
    own = ctx.transformers_config.per_layer_config[layer]
    sizes = LatentSizes(int(own.num_attention_heads), int(own.qk_rope_head_dim), int(own.qk_nope_head_dim),
                        int(own.kv_lora_rank), None if own.q_lora_rank is None else int(own.q_lora_rank))  # fmt: skip
    if sizes.heads > ctx.shape.heads:
        raise PosprobeError(
            f"layer {layer} of '{ctx.source.name}' has {sizes.heads} query heads, more than the config's "
            f"num_attention_heads ({ctx.shape.heads}), which posprobe takes as the model's most",
            "posprobe reads per-layer MLA sizes whose head counts do not exceed num_attention_heads",
        )
    return sizes


def _prefix(ctx) -> str:
    """Where the layer's MLA block lives (`Family.tensors['latent_prefix']`; LongCat-Flash: one per sublayer)."""
    return ctx.family.tensors.get("latent_prefix") or _attention(ctx)


def _linear(ctx, name: str, layer: int, x: np.ndarray) -> np.ndarray:
    w, b = ctx.linear(_prefix(ctx) + name, layer)
    return x @ w.T + b


def _rms(ctx, name: str, layer: int, x: np.ndarray) -> np.ndarray:
    """The MLA block's own RMSNorms (q_a_layernorm, kv_a_layernorm, a rotary key norm; epsilon 1e-6 as most modules
    fix it, the config's where `tensors['latent_norm_eps']` is 'config': Dots3)."""
    eps = ctx.shape.eps if ctx.family.tensors.get("latent_norm_eps") == "config" else 1e-6
    return apply_norm(x, "rmsnorm", ctx.tensor(_prefix(ctx) + name + ".weight", layer), None, eps)


def lora_scales(ctx, layer: int = 0) -> tuple[float, float]:
    """(query factor, position-free key factor) of layer `layer`: LongCat-Flash and Dots3 multiply the normed
    latents by sqrt(d / q_lora_rank) and sqrt(d / kv_lora_rank) (`Family.tensors['latent_lora_scale']`; the ranks
    the layer's own: `layer_sizes`), which W_qb and W_kvb (no bias) carry to q and k_pass; 1 and 1 elsewhere."""
    if "latent_lora_scale" not in ctx.family.tensors:
        return 1.0, 1.0
    d, sizes = ctx.shape.hidden, layer_sizes(ctx, layer)
    return (d / sizes.q_rank) ** 0.5, (d / sizes.kv_rank) ** 0.5


def query_latent(ctx, x: np.ndarray, layer: int) -> np.ndarray:
    """The query LoRA's normed latent RMSNorm(x W_qa + b_qa) of rows x (m, d), times the query factor of
    `lora_scales` (Dots3 rescales it before its indexer reads it too): (m, q_lora_rank)."""
    normed = _rms(ctx, "q_a_layernorm", layer, _linear(ctx, "q_a_proj", layer, x))
    return normed * lora_scales(ctx, layer)[0]


def latent_query_key(ctx, x: np.ndarray, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """Queries and keys of layer-input rows x (m, d) as (H, m, r + p) each, rotary part first (see the module)."""
    sizes = layer_sizes(ctx, layer)
    r, p, rank, heads = sizes.rope, sizes.nope, sizes.kv_rank, sizes.heads
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
    if "rotary_key_norm" in ctx.family.tensors:  # Dots3: an RMS norm of the shared k_rot before it rotates
        k_rot = _rms(ctx, ctx.family.tensors["rotary_key_norm"], layer, k_rot)
    kv = _linear(ctx, "kv_b_proj", layer, _rms(ctx, "kv_a_layernorm", layer, latent))  # (m, H (p + v))
    k_pass = kv.reshape(x.shape[0], heads, -1)[..., :p].transpose(1, 0, 2)  # (H, m, p)
    k_rot = np.broadcast_to(k_rot[None], (heads, *k_rot.shape))
    q_scale, k_scale = lora_scales(ctx, layer)
    q, k_pass = q * q_scale, k_pass * k_scale
    return np.concatenate([q[..., p:], q[..., :p]], -1), np.concatenate([k_rot, k_pass], -1)


def latent_scaling(ctx, layer: int = 0) -> float:
    """The module's own score scale of layer `layer`: (r + p) ** -0.5 (the layer's sizes, `layer_sizes`), times
    YaRN's mscale² where its rope parameters ask (the family's `yarn_apply_mscale`, named in
    `Family.tensors['scaling_function']`; a family without one applies none: Dots3)."""
    sizes = layer_sizes(ctx, layer)
    r, p = sizes.rope, sizes.nope
    if "scaling_function" not in ctx.family.tensors:
        return (r + p) ** -0.5
    module, name = ctx.family.tensors["scaling_function"].split(":")
    apply_mscale = getattr(importlib.import_module(module), name)
    return float(apply_mscale(ctx.transformers_config.rope_parameters, (r + p) ** -0.5))
