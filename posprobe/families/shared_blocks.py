"""Shared attention blocks applied at intervals (Zamba, Zamba2): one stored attention block, or a few used in turn,
runs at every attention depth of a hybrid, reading the hidden state concatenated with the model's embeddings.

Weights (`Family.tensors`): 'shared_blocks' names the config key of the number M of distinct blocks (absent: 1);
the j-th attention depth (0-based, in depth order) runs block j mod M, stored at the (j mod M)-th attention depth
(transformers saves each tied block once, under the first depth that runs it). 'query_adapter' / 'key_adapter'
name the per-depth low-rank adapters (Zamba2's `use_shared_attention_adapter`) with `{l}` the stored depth and
`{j}` the attention depth's index: q = y W_Q^T + (y A^T) B^T, so the effective weight is W_Q + B A.
Input ('concatenated_input'): the block reads y = norm([h; e]) (2d), h the hidden state entering the depth and e
the embedding-level input of the same token; content-free (SPEC §9) both are the embedding-level input x, so
y = norm([x; x]).

Shapes: d hidden width, 2d the block's input width, r the adapter rank; `ctx` a
`posprobe.families.context.ModelContext`.
"""

from __future__ import annotations

import numpy as np

from posprobe.architectures.table import config_default


def block_count(ctx) -> int:
    """M, the number of distinct shared blocks (the config key named by `tensors['shared_blocks']`; 1 when unset)."""
    key = ctx.family.tensors["shared_blocks"]
    value = ctx.config.get(key)
    value = value if value is not None else config_default(ctx.config, (key,))
    return int(value or 1)


def attention_index(ctx, layer: int) -> int | None:
    """j, the position of depth `layer` among the attention depths (0-based), or None for a layer without one."""
    from posprobe.families.windows import attention_layers

    depths = attention_layers(ctx)
    return depths.index(layer) if layer in depths else None


def stored_block_layer(ctx, layer: int) -> int:
    """The depth under which the block that depth `layer` runs is stored (`layer` itself for other layers)."""
    from posprobe.families.windows import attention_layers

    j = attention_index(ctx, layer)
    return layer if j is None else attention_layers(ctx)[j % block_count(ctx)]


def adapter_weight(ctx, which: str, layer: int, shape: tuple[int, int]) -> np.ndarray:
    """The adapter of depth `layer` on projection `which` ('query' or 'key') as one (out, in) matrix B A, to add
    to the projection's weight; zeros where the checkpoint stores none (adapters off)."""
    pattern = ctx.family.tensors.get(f"{which}_adapter")
    j = attention_index(ctx, layer)
    if pattern is None or j is None:
        return np.zeros(shape)
    prefix = pattern.replace("{j}", str(j))
    down = ctx.optional(prefix + ".0.weight", ctx.stored_layer(layer))  # A (r, in)
    if down is None:
        return np.zeros(shape)
    up = ctx.tensor(prefix + ".1.weight", ctx.stored_layer(layer))  # B (out, r)
    return up @ down


def concatenated(hidden: np.ndarray, embeddings: np.ndarray) -> np.ndarray:
    """[h; e] (m, 2d) of hidden rows (m, d) and embedding rows (m, d) or (1, d)."""
    rows = max(hidden.shape[0], embeddings.shape[0])
    return np.concatenate([np.broadcast_to(hidden, (rows, hidden.shape[1])),
                           np.broadcast_to(embeddings, (rows, embeddings.shape[1]))], -1)  # fmt: skip
