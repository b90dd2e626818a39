"""Sparse indexed attention (DeepSeek Sparse Attention: DeepSeek V3.2, GLM-MoE-DSA, ...): a lightning indexer
picks each query's top-k keys, and the layer's softmax runs over those keys only.

The indexer of layer l (module `Family.indexer`) reads the layer input x (d,) after the layer's input norm, and the
query LoRA's normed latent c = RMSNorm(x W_qa + b_qa) of the layer's latent attention (`families.latent.query_latent`:
times sqrt(d / q_lora_rank) where the family rescales it, Dots3):
- H_I query heads q_h = c W_q[h] (d_I dims each) and one key k = LayerNorm(x W_k) (d_I; epsilon 1e-6, or the
  config's norm epsilon with `tensors['indexer_norm_eps']` 'config'), the first r = qk_rope_head_dim dims of each
  (the last r with `tensors['indexer_rope_dims']` 'last': HY-V4) rotated to their positions, paired as
  `Family.tensors['indexer_rotary']` says (the indexer's own layout, which need not be the attention's);
- one weight per head w_h = x W_w[h] * H_I ** -0.5;
- index score I(i, j) = sum_h w_h relu(d_I ** -0.5 (R_i q_h) . (R_j k)) on the pairs the causal mask lets through;
  query i keeps the top-k (config.index_topk) keys of its row, every key it may see where it sees at most k.
A layer whose config.indexer_types entry is 'shared' runs no indexer: it keeps the selection of the last layer
before it that runs one (GLM-MoE-DSA's cross-layer sharing).

SPEC §9: the content-free reading of an indexed layer is its dense attention's F̂ with the pairs its indexer selects
on that same content-free input as the mask, like a window (`windows.LayerKind` 'indexed', `selected`). On a
constant input I(i, j) = sum_h w_h relu(d_I ** -0.5 q_h . R_{j-i} k) depends on j - i alone; ties are broken by
torch's top-k, as the module breaks them.

Shapes: n positions, H_I indexer heads, d_I indexer head size; `ctx` a `posprobe.families.context.ModelContext`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from posprobe.architectures import table as T
from posprobe.families.embeddings import apply_norm
from posprobe.families.latent import query_latent
from posprobe.families.windows import INDEXED, LayerKind


def indexer_layers(ctx, count: int) -> list[int | None]:
    """For each of `count` layers, the layer whose indexer selects its keys: itself, the last earlier layer that
    runs an indexer where its config.indexer_types entry is 'shared', or None (no indexed attention)."""
    types = list(getattr(ctx.transformers_config, "layer_types", None) or ["indexed_attention"] * count)
    sharing = list(getattr(ctx.transformers_config, "indexer_types", None) or ["full"] * count)
    owners, last = [], None
    for layer in range(count):
        if types[layer] != "indexed_attention":
            owners.append(None)
            continue
        if sharing[layer] != "shared":
            last = layer
        owners.append(last)
    return owners


def index_scores(ctx, layer: int, n: int) -> np.ndarray:
    """I(i, j) (n, n) of layer `layer`'s indexer on the content-free input (SPEC §9); -inf where the causal mask
    hides key j from query i (j > i)."""
    prefix = ctx.family.indexer + "."
    x = ctx.word_input(layer)  # (d,), after the layer's input norm
    latent = query_latent(ctx, x[None], layer)[0]  # (q_lora_rank,): the latent attention's, as the indexer reads it
    wq = ctx.tensor(prefix + "wq_b.weight", layer)
    dim = ctx.tensor(prefix + "wk.weight", layer).shape[0]
    q = (latent @ wq.T).reshape(-1, dim)  # (H_I, d_I)
    key_norm = ctx.tensor(prefix + "k_norm.weight", layer), ctx.optional(prefix + "k_norm.bias", layer)
    eps = ctx.shape.eps if ctx.family.tensors.get("indexer_norm_eps") == "config" else 1e-6  # HY-V4: the config's
    k = apply_norm(x @ ctx.tensor(prefix + "wk.weight", layer).T, T.LAYERNORM, *key_norm, eps)  # (d_I,)
    weights = x @ ctx.tensor(prefix + "weights_proj.weight", layer).T * q.shape[0] ** -0.5  # (H_I,)
    if ctx.family.tensors.get("indexer_rope_dims") == "last":  # HY-V4 rotates the last r dims: move them first
        r = int(ctx.config["qk_rope_head_dim"])
        q, k = np.roll(q, r, axis=-1), np.roll(k, r, axis=-1)
    offsets = offset_scores(q, k, weights, *_angles(ctx, n, layer), ctx.family.tensors["indexer_rotary"])  # (n,): -k
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    return np.where(j <= i, offsets[np.clip(i - j, 0, None)], -np.inf)


def offset_scores(q, k, weights, cos, sin, layout: str) -> np.ndarray:
    """I at offsets j - i = 0, -1, ..., -(n - 1), as (n,): q (H_I, d_I), k (d_I,), weights (H_I,); cos, sin (n, r)
    the angles of positions 0..n-1 in rotate_half order. (R_i q) . (R_j k) = q . R_{j-i} k: the key is turned back
    by each offset m (angle -m)."""
    from posprobe.families.rotary import pairing, rotate

    order = pairing(layout, q.shape[-1], cos.shape[-1])
    if order is not None:
        q, k = q[..., order], k[..., order]
    turned = rotate(k[None], cos, -sin)[0]  # (n, d_I): R_{-m} k
    per_head = np.maximum(q @ turned.T * q.shape[-1] ** -0.5, 0.0)  # (H_I, n): relu
    return weights @ per_head


def _angles(ctx, n: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """The rotary angles layer `layer`'s indexer reads: the model's one setting, or its layer type's (Dots3)."""
    from posprobe.families.rotary import rotary_angles
    from posprobe.families.windows import takes_layer_type

    setting = (ctx.transformers_config.layer_types[layer], None) if takes_layer_type(ctx) else None
    if ("rotary", n, setting) not in ctx.cache:
        ctx.cache["rotary", n, setting] = rotary_angles(ctx, n, *(setting or ()))
    return ctx.cache["rotary", n, setting]


def selection(ctx, layer: int, n: int, topk: int) -> np.ndarray:
    """(n, n) bool: the keys each query of layer `layer` keeps (the top `topk` of its causal row of `index_scores`,
    ties broken by torch's top-k as the module's own), on the content-free input."""
    import torch

    scores = torch.from_numpy(index_scores(ctx, layer, n))
    kept = torch.zeros(n, n, dtype=torch.bool)
    if n:
        kept.scatter_(-1, scores.topk(min(topk, n), dim=-1).indices, True)
    return (kept & torch.ones(n, n, dtype=torch.bool).tril()).numpy()  # a short row keeps masked keys: drop them


def indexed_kinds(ctx, kinds: list[LayerKind], n: int) -> list[LayerKind]:
    """`kinds` (`windows.layer_kinds`) with each indexed layer's selection over n positions: the top
    config.index_topk keys per query, picked by its own indexer or by the one it shares; block indexers that pick
    per key-head group (`Family.tensors['indexed_layer_type']`) as `block_indexed` reads them, and those that
    score mean-pooled key blocks (`tensors['indexer_blocks']` 'mean') as `pooled_blocks` does, and weightless ones
    that keep sinks, local keys and a top-k from a pool (`tensors['indexer_picks']`) as `sink_local` does."""
    if "indexed_layer_type" in ctx.family.tensors:
        from posprobe.families.block_indexed import block_indexed_kinds

        return block_indexed_kinds(ctx, kinds, n)
    if ctx.family.tensors.get("indexer_blocks") == "mean":  # mean-pooled key blocks (families.pooled_blocks)
        from posprobe.families.pooled_blocks import pooled_block_kinds

        return pooled_block_kinds(ctx, kinds, n)
    if ctx.family.tensors.get("indexer_picks") == "sinks_local_topk":  # weightless (Kolibri 1.1: families.sink_local)
        from posprobe.families.sink_local import sink_local_kinds

        return sink_local_kinds(ctx, kinds, n)
    topk = int(ctx.transformers_config.index_topk)
    owners = indexer_layers(ctx, len(kinds))
    picks = {owner: np.packbits(selection(ctx, owner, n, topk), axis=1) for owner in set(owners) - {None}}
    out = []
    for layer, (kind, owner) in enumerate(zip(kinds, owners, strict=True)):
        if owner is None:
            out.append(kind)
            continue
        shared = f" (layer {owner}'s indexer)" if owner != layer else ""
        note = ", ".join(x for x in (f"the indexer keeps {topk} keys per query{shared}", kind.note) if x)
        out.append(replace(kind, attention=INDEXED, note=note, selected=picks[owner]))
    return out
