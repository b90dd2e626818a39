"""Block-pooled indexed attention (Qwen4-Exp's QSA): an indexer scores blocks of mean-pooled keys, and each query's
softmax runs over the keys of the blocks it picks plus its own partial block.

The indexer of an indexed layer l (module `Family.indexer`; layers whose config.layer_types entry is
'indexed_attention') reads the layer input x (d,), what the attention projections read:
- one Linear `index_qk_proj` gives H_I query heads q_h and one raw key k(j) (d_I dims each); q_h = N_q(q_h), N_q,
  N_k the indexer's own norms (the family's `norm` kind over d_I, the config's epsilon);
- query i sees keys 0..i; they fall into m(i) = (i + 1) // c complete blocks of c = config.indexer_compress_ratio
  keys (block b: keys bc .. bc + c - 1) and a partial block of the keys mc .. i;
- block key K_b = N_k(mean of k(j) over block b), rotated at the block's first position bc; the query rotated at i
  (the attention's rotary (cos, sin) on the first r dims, rotate_half);
- block score B(i, b) = sum_h relu((R_i q_h) . (R_bc K_b)) / sqrt(d_I);
- query i keeps the keys of its top min(config.indexer_budget / c, m(i)) blocks (ties broken by torch's top-k, as
  the module breaks them) and every key of its partial block.

SPEC §9: as for other indexed layers (`families.indexed`), the content-free reading is the dense attention's F̂
with, as the mask, the pairs selected on that same content-free input (computed here in float64; the module scores
in float32). On a constant input K_b is one vector for every block, so B(i, b) depends on i - bc; the selection
does not depend on j - i alone (blocks start at multiples of c).

Shapes: n positions, H_I indexer heads, d_I indexer head size; `ctx` a `posprobe.families.context.ModelContext`.
"""

from __future__ import annotations

import numpy as np

from posprobe.families.embeddings import apply_norm
from posprobe.families.windows import LayerKind, with_indexed_selections


def block_scores(ctx, layer: int, n: int) -> np.ndarray:
    """(n, n // c) block scores B(i, b) of layer `layer`'s indexer on the content-free input (module docstring),
    for every complete block of the n positions (a query reads only the blocks it has completed)."""
    from posprobe.families.rotary import rotary_angles, rotate

    prefix, cfg = ctx.family.indexer + ".", ctx.transformers_config
    x = ctx.word_input(layer)  # (d,): what the attention projections read
    q_norm, k_norm = (ctx.tensor(prefix + name + ".weight", layer) for name in ("q_layernorm", "k_layernorm"))
    dim, eps = q_norm.shape[0], ctx.shape.eps
    qk = x @ ctx.tensor(prefix + "index_qk_proj.weight", layer).T  # ((H_I + 1) d_I,): the heads' queries, one key
    q = apply_norm(qk[:-dim].reshape(-1, dim), ctx.family.norm, q_norm, None, eps)  # (H_I, d_I)
    k = apply_norm(qk[-dim:], ctx.family.norm, k_norm, None, eps)  # (d_I,): the mean of equal keys is that key
    if ("rotary", n, None) not in ctx.cache:  # the module's (cos, sin) (n, r), as families.indexed keeps them
        ctx.cache["rotary", n, None] = rotary_angles(ctx, n)
    cos, sin = ctx.cache["rotary", n, None]
    size = int(cfg.indexer_compress_ratio)
    starts = np.arange(n // size) * size
    queries = rotate(q, cos, sin)  # (H_I, n, d_I)
    keys = rotate(k[None], cos[starts], sin[starts])[0]  # (blocks, d_I)
    return np.maximum(queries @ keys.T, 0.0).sum(0) / np.sqrt(dim)


def selection(ctx, layer: int, n: int) -> np.ndarray:
    """(n, n) bool: the keys each query of layer `layer` keeps on the content-free input (module docstring)."""
    import torch

    cfg = ctx.transformers_config
    size = int(cfg.indexer_compress_ratio)
    topk = int(cfg.indexer_budget) // size
    scores = block_scores(ctx, layer, n)
    kept = np.zeros((n, n), dtype=bool)
    for i in range(n):
        complete = (i + 1) // size
        if complete:  # one top-k per query over its complete blocks, as the module runs it
            picked = torch.from_numpy(scores[i, :complete]).topk(min(topk, complete)).indices.numpy()
            kept[i, (picked[:, None] * size + np.arange(size)).ravel()] = True
        kept[i, complete * size : i + 1] = True  # the query's partial block
    return kept


def pooled_block_kinds(ctx, kinds: list[LayerKind], n: int) -> list[LayerKind]:
    """`kinds` (`windows.layer_kinds`) with each indexed layer's selection over n positions."""
    cfg = ctx.transformers_config
    size = int(cfg.indexer_compress_ratio)
    words = (f"the indexer keeps {int(cfg.indexer_budget) // size} mean-pooled blocks of {size} keys per query, "
             "and its partial block")  # fmt: skip
    return with_indexed_selections(ctx, kinds, words, lambda layer: selection(ctx, layer, n))
