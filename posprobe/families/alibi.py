"""Content-free scores of ALiBi families (SPEC §9): F_hat(i, j) = q . k * scaling - s_b |B_h(j) - B_h(i)|.

q and k are the same at every position (content-free input, no positional term in them), so q . k is one
constant per head. B_h(j) is the bias the family's own transformers code adds for key j of a sequence of n
tokens (BLOOM's `build_alibi_tensor`: m_h * j; Falcon's: the same rounded to bfloat16; MPT's
`build_mpt_alibi_tensor` as MptModel calls it: m_h * (j - n + 1)); s_b is 1, or the attention scale where
the family scales the bias with q . k (Falcon). On the causal pairs (j <= i) B_h is increasing in j, so the
formula equals the model's scores (q . k * scaling + s_b B_h(j)) less a constant per row (s_b B_h(i)), which
softmax ignores; with exact slopes it is -m_h |j - i|.
"""

from __future__ import annotations

import importlib

import numpy as np

from posprobe.families.context import head_products

BLOOM_BIAS = "transformers.models.bloom.modeling_bloom:build_alibi_tensor"  # default `Family.tensors['alibi']`
MPT_BIAS = "build_mpt_alibi_tensor"  # MPT's own call (`build_mpt_alibi_tensor`, a different signature)


def key_biases(heads: int, n: int, convention: str = BLOOM_BIAS) -> np.ndarray:
    """B (H, n): the bias the family adds to the score of key j (float64 from the family's own precision):
    `convention` is 'module:function' of a BLOOM-style builder (attention mask, heads, dtype), or MPT_BIAS."""
    import torch

    if convention == MPT_BIAS:
        from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

        # transformers' MptModel calls it with the default alibi_bias_max = 8 whatever attn_config says: so do we.
        return build_mpt_alibi_tensor(heads, n).double()[:, 0, :].numpy()  # (H, 1, n) = m_h * (j - n + 1)
    module, name = convention.split(":")
    build = getattr(importlib.import_module(module), name)
    alibi = build(torch.ones(1, n, dtype=torch.long), heads, torch.float64)  # (H, 1, n) = m_h * j
    return alibi.reshape(heads, n).double().numpy()


def alibi_slopes(heads: int, convention: str = BLOOM_BIAS) -> np.ndarray:
    """m_h (H,) as the family computes them: its bias of key 1 less that of key 0."""
    b = key_biases(heads, 2, convention)
    return b[:, 1] - b[:, 0]


def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder", inputs=None) -> np.ndarray:
    """F_hat (H, n, n): row i = query position, column j = key position (k = j - i); `inputs`: data-conditioned
    layer inputs (`LayerInputs`) or None."""
    q, k = ctx.query_key(layer, stack, inputs)  # (H, d_h), (H_kv, d_h); or (H, n, d_h), (H_kv, n, d_h) per position
    scale = (ctx.config.get("attn_config") or {}).get("softmax_scale") or ctx.scaling  # MPT may set its own
    content = head_products(q, k) * scale  # (H, 1, 1), or (H, n, n) per position
    key = ("alibi", n)
    if key not in ctx.cache:  # the same biases for every layer
        ctx.cache[key] = key_biases(q.shape[0], n, ctx.family.tensors.get("alibi", BLOOM_BIAS))
    b = ctx.cache[key]
    bias_scale = scale if ctx.family.tensors.get("alibi_scaled") else 1.0  # Falcon: (q . k + alibi) / sqrt(d_h)
    return content - bias_scale * np.abs(b[:, None, :] - b[:, :, None])


def toeplitz_by_construction(ctx, stack: str = "encoder", conditioned: bool = False) -> bool:
    """Always, for an input that is the same at every position: q . k is one constant per head and -m_h |j - i|
    depends on j - i alone, so R^2 = 1 whatever the weights."""
    return True
