"""One shared key-value head with a query LoRA (DeepSeek V4, `table.SHARED_KV`), and the pooled entries its
compressed layers append to the keys.

For a layer input x (d,) (after the layer's input norm), with H heads of d_h dims whose last r = qk_rope_head_dim
dims rotate (interleaved pairs 2i, 2i + 1 of those r):
- query per head h: q_h = norm(RMSNorm(x W_qa) W_qb)_h, the last norm over each head's d_h dims without weights;
- one key for every head: k = RMSNorm(x W_kv) (d_h,), which is also the value;
- F̂(i, j) = (R_i q_h) . (R_j k) * scaling over the raw keys (positions j of the sequence), the rotation that of
  the layer's rope type (config.rope_parameters: 'main' for sliding layers, 'compress' for the others).
`shared_kv_query_key` returns q and k with each head's dims reordered [even rotated dims | odd rotated dims | the
rest]: pair i then holds dims i and i + r/2 (rotate_half order, `table.HALF_ANGLES` angles) and the unrotated dims
come last, as posprobe's rotary code takes them (a dot product does not change when q and k are permuted alike).
A compressed layer (config.layer_types 'compressed_sparse_attention' / 'heavily_compressed_attention') also appends
to each softmax entries pooled over blocks of config.compress_rates[type] tokens (an indexer picks a top-k of them in
CSA layers): not positions, so not in F̂ (SPEC §9); `pooled_entries` says how many a sequence gets.

Shapes: H heads, d hidden, m rows; `ctx` a `posprobe.families.context.ModelContext`.
"""

from __future__ import annotations

import numpy as np

from posprobe.architectures import table as T
from posprobe.families.embeddings import apply_norm

# The attention block's tensors as transformers names them loaded, then as the files name them (save_pretrained
# writes the released checkpoints' names)
_NAMES = {
    "q_a": "layers.{l}.(self_attn.q_a_proj|attn.wq_a)",
    "q_a_norm": "layers.{l}.(self_attn.q_a_norm|attn.q_norm)",
    "q_b": "layers.{l}.(self_attn.q_b_proj|attn.wq_b)",
    "kv": "layers.{l}.(self_attn.kv_proj|attn.wkv)",
    "kv_norm": "layers.{l}.(self_attn.kv_norm|attn.norm)",
}


def rotated_dims(ctx) -> int:
    """r: the trailing dims of each head that rotate (the config's qk_rope_head_dim, as its config class sets it)."""
    return int(ctx.transformers_config.qk_rope_head_dim)


def rotary_first(x: np.ndarray, r: int) -> np.ndarray:
    """Heads x (..., d_h) whose last r dims rotate in interleaved pairs, as (..., d_h) in the order
    [dims d_h - r, d_h - r + 2, ... | d_h - r + 1, d_h - r + 3, ... | dims 0 .. d_h - r - 1]."""
    rotated = x[..., x.shape[-1] - r :]
    return np.concatenate([rotated[..., 0::2], rotated[..., 1::2], x[..., : x.shape[-1] - r]], -1)


def shared_kv_query_key(ctx, x: np.ndarray, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """Queries (H, m, d_h) and the one key head (1, m, d_h) of layer-input rows x (m, d), rotated dims first (see
    the module)."""
    eps, heads = ctx.shape.eps, ctx.shape.heads
    w, b = ctx.linear(_NAMES["q_a"], layer)
    latent = apply_norm(x @ w.T + b, T.RMSNORM, ctx.tensor(_NAMES["q_a_norm"] + ".weight", layer), None, eps)
    w, b = ctx.linear(_NAMES["q_b"], layer)
    q = (latent @ w.T + b).reshape(x.shape[0], heads, -1).transpose(1, 0, 2)  # (H, m, d_h)
    q = apply_norm(q, T.PLAIN_RMSNORM, None, None, eps)  # each head over its own dims, no weights
    w, b = ctx.linear(_NAMES["kv"], layer)
    k = apply_norm(x @ w.T + b, T.RMSNORM, ctx.tensor(_NAMES["kv_norm"] + ".weight", layer), None, eps)[None]
    r = rotated_dims(ctx)
    return rotary_first(q, r), rotary_first(k, r)


def pooled_rate(ctx, layer_type: str | None) -> int | None:
    """The block size a layer of `layer_type` pools its appended entries over (config.compress_rates[type],
    `Family.tensors['pooled_keys']`), or None for a layer without them (a sliding layer)."""
    key = ctx.family.tensors.get("pooled_keys")
    rates = getattr(ctx.transformers_config, key, None) if key else None
    rate = (rates or {}).get(layer_type) if layer_type else None
    return int(rate) if rate else None


def pooled_entries(ctx, layer: int, n: int) -> int:
    """How many pooled entries layer `layer` appends to every softmax of a sequence of n tokens (one per complete
    block; each query sees those of the blocks it has passed): 0 where it appends none."""
    rate = pooled_rate(ctx, ctx.layer_kinds(1)[layer].layer_type)
    return 0 if rate is None else n // rate
