"""Content-free scores of ALiBi families (SPEC §9): F_hat(i, j) = q . k * scaling - m_h |j - i|.

q and k are the same at every position (content-free input, no positional term in them), so q . k is one
constant per head; m_h are the slopes exactly as the family's transformers code computes them (BLOOM's
`build_alibi_tensor`). BLOOM adds `m_h * j`, which differs from `-m_h |j - i|` by a per-row constant on the
causal pairs (j <= i): softmax ignores it.
"""

from __future__ import annotations

import numpy as np


def alibi_slopes(heads: int) -> np.ndarray:
    """m_h (H,) as BLOOM computes them (float32, then widened)."""
    import torch
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float64)  # (H, 1, 2) = m_h * j
    return alibi[:, 0, 1].numpy()


def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder") -> np.ndarray:
    """F_hat (H, n, n): row i = query position, column j = key position (k = j - i)."""
    q, k = ctx.query_key(layer, stack)  # (H, d_h), (H_kv, d_h)
    k = np.repeat(k, q.shape[0] // k.shape[0], axis=0)
    content = (q * k).sum(-1) * ctx.scaling  # (H,)
    slopes = alibi_slopes(q.shape[0])
    distance = np.abs(np.arange(n)[None, :] - np.arange(n)[:, None]).astype(np.float64)  # |j - i|
    return content[:, None, None] - slopes[:, None, None] * distance[None]
