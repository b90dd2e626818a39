"""Content-free scores of ALiBi families (SPEC §9): F_hat(i, j) = q . k * scaling - m_h |j - i|.

q and k are the same at every position (content-free input, no positional term in them), so q . k is one
constant per head; m_h are the slopes exactly as the family's transformers code computes them (BLOOM's
`build_alibi_tensor`, MPT's `build_mpt_alibi_tensor` as MptModel calls it). BLOOM adds `m_h * j`, MPT
`m_h * (j - n + 1)`: both differ from `-m_h |j - i|` by a per-row constant on the causal pairs (j <= i), which
softmax ignores.
"""

from __future__ import annotations

import numpy as np

from posprobe.families.context import head_products

BLOOM_SLOPES = "build_alibi_tensor"  # `Family.tensors['alibi']`: the transformers function whose slopes it uses
MPT_SLOPES = "build_mpt_alibi_tensor"


def alibi_slopes(heads: int, convention: str = BLOOM_SLOPES) -> np.ndarray:
    """m_h (H,) as the family computes them (float32, then widened): BLOOM's or MPT's code (`convention`)."""
    import torch

    if convention == MPT_SLOPES:
        from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

        # transformers' MptModel calls it with the default alibi_bias_max = 8 whatever attn_config says: so do we.
        alibi = build_mpt_alibi_tensor(heads, 2).double()  # (H, 1, 2) = m_h * (j - 1)
        return (alibi[:, 0, 1] - alibi[:, 0, 0]).numpy()
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float64)  # (H, 1, 2) = m_h * j
    return alibi[:, 0, 1].numpy()


def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder") -> np.ndarray:
    """F_hat (H, n, n): row i = query position, column j = key position (k = j - i)."""
    q, k = ctx.query_key(layer, stack)  # (H, d_h), (H_kv, d_h); or (H, n, d_h), (H_kv, n, d_h) per position
    scale = (ctx.config.get("attn_config") or {}).get("softmax_scale") or ctx.scaling  # MPT may set its own
    content = head_products(q, k) * scale  # (H, 1, 1), or (H, n, n) per position
    slopes = alibi_slopes(q.shape[0], ctx.family.tensors.get("alibi", BLOOM_SLOPES))
    distance = np.abs(np.arange(n)[None, :] - np.arange(n)[:, None]).astype(np.float64)  # |j - i|
    return content - slopes[:, None, None] * distance[None]


def toeplitz_by_construction(ctx, stack: str = "encoder") -> bool:
    """Always, for an input that is the same at every position: q . k is one constant per head and -m_h |j - i|
    depends on j - i alone, so R^2 = 1 whatever the weights."""
    return True
