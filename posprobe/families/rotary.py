"""Content-free scores of rotary (RoPE) families (SPEC §9): F_hat(i, j) = (R_i q) . (R_j k) * scaling.

Shapes: H query heads, H_kv key heads (query head h reads key head h // (H / H_kv)), d_h head size, r <= d_h
rotated dimensions (partial rotary: the first r dims rotate, the rest pass through), n positions.
The rotation angles come from the family's own transformers rotary module (`Family.rotary_class`), built from
the checkpoint's config: its rope initialisation gives the frequencies and the attention scaling of every
`rope_type` (default, linear, dynamic, yarn, longrope, llama3, ...), in the precision the model uses. The
module holds no weights; no model is built. Rotation convention: transformers' `rotate_half` (the two halves
of the rotated dims pair up).
"""

from __future__ import annotations

import importlib

import numpy as np

from posprobe.errors import PosprobeError


def transformers_config(ctx):
    """The checkpoint's config as its transformers config class (rope_scaling etc. normalised by it)."""
    from transformers import AutoConfig

    config = {k: v for k, v in ctx.config.items() if k not in ("model_type", "transformers_version")}
    try:
        return AutoConfig.for_model(ctx.source.model_type, **config)
    except Exception as err:  # config classes validate rope parameters with several exception types
        raise PosprobeError(
            f"transformers refuses the config of '{ctx.source.name}': {str(err).splitlines()[0][:200]}",
            "fix config.json (rope_scaling / rope_parameters) or re-save the checkpoint",
        ) from err


def rotary_angles(ctx, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), each (n, r) float64, exactly as the family's rotary module gives them for positions 0..n-1
    (attention scaling of yarn / longrope included)."""
    import torch

    module_name, class_name = ctx.family.rotary_class.split(":")
    rotary_class = getattr(importlib.import_module(module_name), class_name)
    config = transformers_config(ctx)
    with torch.no_grad():
        rotary = rotary_class(config=config)
        x = torch.zeros(1, n, 1, dtype=torch.float64)
        cos, sin = rotary(x, torch.arange(n)[None])
    return cos[0].double().numpy(), sin[0].double().numpy()


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Vectors x (G, d_h), the same at every position, or (G, n, d_h), one per position, rotated to their
    positions: (G, n, d_h), the first r = cos.shape[-1] dims rotated."""
    n, r = cos.shape
    x = np.broadcast_to(x[:, None, :] if x.ndim == 2 else x, (x.shape[0], n, x.shape[-1]))
    rot, rest = x[..., :r], x[..., r:]
    half = r // 2
    rotated = rot * cos + np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1) * sin  # rotate_half
    return np.concatenate([rotated, rest], axis=-1)


def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder") -> np.ndarray:
    """F_hat (H, n, n): row i = query position, column j = key position (k = j - i)."""
    q, k = ctx.query_key(layer, stack)  # (H, d_h), (H_kv, d_h); or (H, n, d_h), (H_kv, n, d_h) per position
    if ("rotary", n) not in ctx.cache:  # the same angles for every layer
        ctx.cache["rotary", n] = rotary_angles(ctx, n)
    cos, sin = ctx.cache["rotary", n]
    if cos.shape[-1] > q.shape[-1] or cos.shape[-1] % 2:
        raise PosprobeError(
            f"the rotary module of '{ctx.source.name}' rotates {cos.shape[-1]} dims of {q.shape[-1]}-dim heads",
            "the config is malformed; re-save the checkpoint",
        )
    heads, kv_heads, dh = q.shape[0], k.shape[0], q.shape[-1]
    qr = rotate(q * ctx.scaling, cos, sin)  # (H, n, d_h)
    kr = rotate(k, cos, sin)  # (H_kv, n, d_h)
    # Query heads h = g * m .. g * m + m - 1 read key head g: one (m n, d_h) x (d_h, n) product per group.
    grouped = qr.reshape(kv_heads, (heads // kv_heads) * n, dh)
    scores = grouped @ np.ascontiguousarray(kr.transpose(0, 2, 1))  # (H_kv, m n, n)
    return ctx.softcap(scores.reshape(heads, n, n))


def toeplitz_by_construction(ctx, stack: str = "encoder") -> bool:
    """Always, for an input that is the same at every position: (R_i q) . (R_j k) = q . R_{j-i} k depends on
    j - i alone (a soft cap applied after keeps that), so R^2 = 1 whatever the weights."""
    return True
