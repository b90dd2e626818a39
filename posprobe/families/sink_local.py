"""A weightless indexer that keeps sinks, local keys and a top-k from a pool (Kolibri 1.1's indexed layers).

The indexer of an indexed layer (config.layer_types 'indexed_attention') has no weights: it scores key j for query i
by the relu of the logits of the layer's first `index_num_heads` query heads against key head 0 (both rounded to
NVFP4), averaged over those heads. Query i, which sees keys 0..i (L = i + 1 of them), keeps:
- every key where L <= index_topk + index_num_local_tokens + index_num_sink_tokens;
- otherwise the first S = index_num_sink_tokens keys, the last index_num_local_tokens keys (L - local .. i), and the
  top index_topk of the candidates between them that lie in its pool. The pool is every key where
  L <= index_pool_size; else the keys of the top index_pool_size / c blocks of c = index_compression keys (a block
  scored by its mean key; the query's partial block competes with a score of 0). Layers listed in
  config.index_layers pick the pool; the other indexed layers reuse the last one picked before them.
The module breaks ties towards the lowest indices (its `top_k_mask`). These layers attend keys rounded to NVFP4
(`tensors['key_rounding']`, the family's own rounding function; `rounded_keys`); they are NoPE, so the rounding acts
on the keys as projected and normed.

SPEC §9: the content-free reading of an indexed layer is its attention's F̂ with, as the mask, the pairs its indexer
selects on that same content-free input. There every key is one vector, so every candidate key and every complete
block scores the same value s >= 0 (a relu) for a query: the ties give the earliest keys and blocks (the partial block,
at 0 <= s, comes after the complete ones). The selection is then the rule above with the earliest candidates:
keys 0..S-1, the first index_topk keys from S on that lie below L - local and, where L > index_pool_size, below
index_pool_size; and the local keys. It depends on the positions alone, not on the weights.

Shapes: n positions; `ctx` a `posprobe.families.context.ModelContext`.
"""

from __future__ import annotations

import numpy as np

from posprobe.architectures import table as T
from posprobe.families.windows import INDEXED_LAYER_TYPE, LayerKind, with_indexed_selections


def selection(ctx, n: int) -> np.ndarray:
    """(n, n) bool: the keys each query of an indexed layer keeps on the content-free input (module docstring)."""
    cfg = ctx.transformers_config
    topk, pool = int(cfg.index_topk), int(cfg.index_pool_size)
    local, sinks = int(cfg.index_num_local_tokens), int(cfg.index_num_sink_tokens)
    kept = np.tril(np.ones((n, n), dtype=bool))
    keys = np.arange(n)
    for i in range(n):
        length = i + 1
        if length <= topk + local + sinks:
            continue  # every key it sees
        candidates = (keys >= sinks) & (keys < length - local) & (keys < pool if length > pool else True)
        picked = keys[candidates][:topk]
        kept[i] = (keys < sinks) | ((keys >= length - local) & (keys < length)) | np.isin(keys, picked)
    return kept


def sink_local_kinds(ctx, kinds: list[LayerKind], n: int) -> list[LayerKind]:
    """`kinds` (`windows.layer_kinds`) with each indexed layer's selection over n positions (one for every such
    layer: the rule does not depend on the layer's weights)."""
    cfg = ctx.transformers_config
    sinks, local, topk = int(cfg.index_num_sink_tokens), int(cfg.index_num_local_tokens), int(cfg.index_topk)
    words = f"the indexer keeps {sinks} sink keys, the last {local} and {topk} more per query"
    picked = selection(ctx, n)
    return with_indexed_selections(ctx, kinds, words, lambda layer: picked)


def rounded_keys(ctx, layer: int, k: np.ndarray) -> np.ndarray:
    """Keys k (H_kv, ..., d_h) of layer `layer` as its softmax reads them: rounded by the family's own function
    (`tensors['key_rounding']`, 'module:function': Kolibri 1.1's NVFP4 round trip, blocks of 16 along d_h) in an
    indexed layer, unchanged in the others."""
    import importlib

    import torch

    rule = ctx.family.tensors.get("key_rounding")
    types = T.layer_types(ctx.family, ctx.transformers_config) if rule else []
    if not rule or layer >= len(types) or types[layer] != INDEXED_LAYER_TYPE:
        return k
    module, name = rule.split(":")
    return getattr(importlib.import_module(module), name)(torch.from_numpy(np.ascontiguousarray(k))).numpy()
