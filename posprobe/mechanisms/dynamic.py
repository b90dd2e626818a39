"""Dynamic lightweight convolution = Shaw et al. relative keys (SPEC §5): `+ q_i . w[kc] / sqrt(d_h)`.

Table `w` `(2r+1, d_h)` shared by the heads of a layer: `(2r+1)*d_h` parameters per depth. Efficient form
(Shaw §3.3): `q @ w^T` once -> `(B, H, n_q, 2r+1)`, then a gather by `kc + r` -> `(B, H, n_q, n_k)`.
"""

from __future__ import annotations

import torch
from torch import nn

from posprobe.mechanisms.base import (
    LayerShape,
    PositionalMechanism,
    clip,
    clipped_index,
    register,
    relative_to_absolute,
    reset_parameter,
)
from posprobe.mechanisms.catalogue import Options
from posprobe.mechanisms.flex import clip_bound


class RelativeTable(PositionalMechanism):
    """Shared base of the query- and key-based tables: one `(2r+1, d_h)` parameter `w`."""

    def __init__(self, shape: LayerShape, options: Options | None = None):
        super().__init__(shape, options)
        self.w = nn.Parameter(torch.zeros(2 * self.radius + 1, shape.head_dim))

    def reset(self, init: str = "zero", generator: torch.Generator | None = None) -> None:
        reset_parameter(self.w, init, generator, 0.5)


def _offset_scores(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (B, H, n, d_h) against the offset table w (2r+1, d_h): (B, H, n, 2r+1) scores, scaled by 1/sqrt(d_h)."""
    return torch.matmul(x, w.t().to(x.dtype)) * x.shape[-1] ** -0.5


@register
class DynamicConvolution(RelativeTable):
    name = "dynamic"

    def score_bias(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        rel = _offset_scores(query, self.w)  # (B, H, n_q, 2r+1)
        index = clipped_index(query.shape[-2], key.shape[-2], self.radius, query.device)
        return relative_to_absolute(rel, index)

    def score_mod(self, query: torch.Tensor, key: torch.Tensor):
        rel = _offset_scores(query, self.w)  # (B, H, n_q, 2r+1)
        r = clip_bound(self.radius, query.device)

        def dynamic_mod(score, b, h, q_idx, kv_idx):
            return score + rel[b, h, q_idx, torch.clamp(kv_idx - q_idx, -r, r) + r]

        return dynamic_mod

    def naive_score(self, h, i, j, q_i, k_j):
        return q_i @ self.w[clip(j - i, self.radius) + self.radius] / self.shape.head_dim**0.5


@register
class KeyDynamicConvolution(RelativeTable):
    name = "key-dynamic"

    def score_bias(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        rel = _offset_scores(key, self.w)  # (B, H, n_k, 2r+1)
        # row j, column i holds clip(i - j) + r: the offset index of the transposed problem
        index = clipped_index(key.shape[-2], query.shape[-2], self.radius, key.device)
        return relative_to_absolute(rel, index).transpose(-1, -2)  # (B, H, n_q, n_k)

    def score_mod(self, query: torch.Tensor, key: torch.Tensor):
        rel = _offset_scores(key, self.w)  # (B, H, n_k, 2r+1)
        r = clip_bound(self.radius, query.device)

        def key_dynamic_mod(score, b, h, q_idx, kv_idx):
            return score + rel[b, h, kv_idx, torch.clamp(q_idx - kv_idx, -r, r) + r]

        return key_dynamic_mod

    def naive_score(self, h, i, j, q_i, k_j):
        return k_j @ self.w[clip(i - j, self.radius) + self.radius] / self.shape.head_dim**0.5
