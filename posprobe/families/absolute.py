"""Scores of absolute position tables (learned, or sinusoidal as the model builds them): F_hat_P of SPEC §3.

paper mode     F_h = (e_w Wq_h Wk_h^T E_P^T + E_P Wq_h Wk_h^T e_w^T + E_P Wq_h Wk_h^T E_P^T) * scaling
faithful mode  F_h = (X Wq_h + bq_h)(X Wk_h + bk_h)^T * scaling, X = the real layer input of a sequence of the
               average word (token type 0, embedding norm, projection, the layer's pre-attention norm).
Row i is the query position, column j the key position (k = j - i); `ctx.mode` picks the mode.
"""

from __future__ import annotations

import numpy as np

from posprobe.analysis.fhat import LayerInput, fhat_matrices, paper_input


def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder", inputs=None) -> np.ndarray:
    """F_hat_P (H, n, n) of depth `layer` over the table's first `n` positions (`ModelContext`); data-conditioned
    layer `inputs` (`LayerInputs`, SPEC §13) in place of the embedding level where given."""
    weights = ctx.attention(layer, stack)
    wq, bq, wk, bk = weights.linear()
    table = ctx.position_table.table[:n]
    heads, kv_heads = ctx.shape.heads, ctx.shape.kv_heads
    if kv_heads != heads:  # shared key heads (GPT-BigCode's multi-query): each query head reads its group's key
        wk, bk = (None if x is None else np.repeat(x.reshape(kv_heads, -1, *x.shape[1:]), heads // kv_heads, axis=0)
                  .reshape(-1, *x.shape[1:]) for x in (wk, bk))  # fmt: skip
    if ctx.mode == "paper" and inputs is None:
        key = ("paper", n)
        if key not in ctx.cache:  # the same projected inputs for every layer
            ctx.cache[key] = paper_input(table, ctx.word, ctx.projection())
        scores = fhat_matrices(ctx.cache[key], wq, wk, heads, scale=ctx.scaling)
    else:  # faithful, or data-conditioned (SPEC §13: the table is inside the layer input already)
        x = np.broadcast_to(ctx.layer_rows(layer, stack, table, inputs), (n, ctx.shape.hidden))
        scores = fhat_matrices(LayerInput(full=x), wq, wk, heads, bq, bk, scale=ctx.scaling)
    return ctx.softcap(scores)


def toeplitz_by_construction(ctx, stack: str = "encoder", conditioned: bool = False) -> bool:
    """Not for the embedding-level input: the scores depend on the positions i and j through the table, so their
    Toeplitz R^2 is a finding. For a data-conditioned input that is the same at every position (SPEC §13 'mean')
    the table is inside that one input, so every score of a head is the same number (Toeplitz, R^2 undefined)."""
    return conditioned
