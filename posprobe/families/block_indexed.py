"""Block-sparse indexed attention (MiniMax M3): an indexer picks, for each query and each key-head group, blocks
of keys, and each query head's softmax runs over the keys of the blocks its group's indexer head picked.

The indexer of a sparse layer l (module `Family.indexer`; its layers are those whose config.layer_types entry is
`Family.tensors['indexed_layer_type']`) reads the layer input x (d,) after the layer's input norm:
- H_I heads q_h = N_q(x W_q[h]) and one key k = N_k(x W_k) (d_I dims each; N_q, N_k the indexer's own norms of the
  family's `norm` kind over d_I), rotated as the attention rotates: the module's (cos, sin) cut to their first
  d_I columns, rotate_half over the first min(d_I, r) dims;
- score s_h(i, j) = (R_i q_h) . (R_j k) where key j is not after query i (j <= i), -inf elsewhere;
- key blocks of b = config.index_block_size positions (the last one short): block score B_h(i, c) = max over the
  keys j of block c of s_h(i, j); the config.index_local_blocks blocks ending at the query's own (i // b - t,
  t = 0..local-1, clipped at 0) score +inf;
- query i of group h keeps the top min(config.index_topk_blocks, blocks) blocks of B_h(i, .) (ties broken by
  torch's top-k, as the module breaks them) whose score is not -inf, and of those the keys j <= i.
Query head a reads the selection of indexer head a // (H / H_I) (H_I = the key heads: one per key-head group).

SPEC §9: as for other indexed layers (`families.indexed`), the content-free reading is the dense attention's F̂
with, as the mask, the pairs selected on that same content-free input, here one mask per key-head group.

Shapes: n positions, H_I indexer heads, d_I indexer head size; `ctx` a `posprobe.families.context.ModelContext`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from posprobe.families.embeddings import apply_norm
from posprobe.families.windows import INDEXED, LayerKind


def block_scores(ctx, layer: int, n: int) -> np.ndarray:
    """(H_I, n, blocks) block scores B_h(i, c) of layer `layer`'s indexer on the content-free input, local blocks
    +inf, blocks wholly after the query -inf (module docstring)."""
    from posprobe.families.rotary import rotary_angles, rotate

    prefix, cfg = ctx.family.indexer + ".", ctx.transformers_config
    x = ctx.word_input(layer)  # (d,), after the layer's input norm
    wk = ctx.tensor(prefix + "k_proj.weight", layer)
    dim, eps = wk.shape[0], float(cfg.rms_norm_eps)
    q = (x @ ctx.tensor(prefix + "q_proj.weight", layer).T).reshape(-1, dim)  # (H_I, d_I)
    q = apply_norm(q, ctx.family.norm, ctx.tensor(prefix + "q_norm.weight", layer), None, eps)
    k = apply_norm(x @ wk.T, ctx.family.norm, ctx.tensor(prefix + "k_norm.weight", layer), None, eps)  # (d_I,)
    if ("rotary", n, None) not in ctx.cache:  # the module's (cos, sin) (n, r), as families.indexed keeps them
        ctx.cache["rotary", n, None] = rotary_angles(ctx, n)
    cos, sin = ctx.cache["rotary", n, None]
    cos, sin = cos[:, :dim], sin[:, :dim]  # the module cuts its (cos, sin) to the indexer's head size
    scores = rotate(q, cos, sin) @ rotate(k[None], cos, sin)[0].T  # (H_I, n, n): (R_i q_h) . (R_j k)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    scores = np.where(j <= i, scores, -np.inf)
    size = int(cfg.index_block_size)
    blocks = -(-n // size)
    padded = np.full((len(q), n, blocks * size), -np.inf)
    padded[..., :n] = scores
    pooled = padded.reshape(len(q), n, blocks, size).max(-1)  # (H_I, n, blocks)
    own = np.arange(n) // size
    for t in range(int(cfg.index_local_blocks)):
        pooled[:, np.arange(n), np.clip(own - t, 0, None)] = np.inf
    return pooled


def group_selection(ctx, layer: int, n: int) -> np.ndarray:
    """(H_I, n, n) bool: the keys each query of each key-head group keeps in layer `layer`, on the content-free
    input (the module's top-k of `block_scores`, ties broken by torch's top-k; then causality)."""
    import torch

    pooled = torch.from_numpy(block_scores(ctx, layer, n))
    heads, _, blocks = pooled.shape
    top = pooled.topk(min(int(ctx.transformers_config.index_topk_blocks), blocks), dim=-1)
    kept = torch.zeros(heads, n, blocks + 1, dtype=torch.bool)  # a slot whose block scores -inf: the last column
    kept.scatter_(-1, top.indices.masked_fill(top.values == -torch.inf, blocks), True)
    size = int(ctx.transformers_config.index_block_size)
    keys = kept[..., :blocks].repeat_interleave(size, dim=-1)[..., :n]
    return (keys & torch.ones(n, n, dtype=torch.bool).tril()).numpy()


def block_indexed_kinds(ctx, kinds: list[LayerKind], n: int) -> list[LayerKind]:
    """`kinds` (`windows.layer_kinds`) with each sparse layer's selection over n positions, one per key-head
    group (`LayerKind.selected` (H_I, n, bytes), read by H / H_I query heads each)."""
    cfg = ctx.transformers_config
    sparse = ctx.family.tensors["indexed_layer_type"]
    types = list(cfg.layer_types)
    words = (f"the indexer keeps {cfg.index_topk_blocks} blocks of {cfg.index_block_size} keys per query and "
             f"key-head group ({cfg.index_local_blocks} local)")  # fmt: skip
    out = []
    for layer, kind in enumerate(kinds):
        if types[layer] != sparse:
            out.append(kind)
            continue
        picks = group_selection(ctx, layer, n)
        note = ", ".join(x for x in (words, kind.note) if x)
        heads = ctx.shape.heads // len(picks)
        out.append(replace(kind, attention=INDEXED, note=note, selected=np.packbits(picks, axis=-1), group=heads))
    return out
