"""Fixed lightweight convolution (T5-style relative bias, SPEC §5): `+ beta[h, kc]`, `kc = clip(j - i, -r, r)`.

Table `beta` `(H, 2r+1)` per depth, row `kc + r`; `H*(2r+1)` parameters. The bias `(1, H, n_q, n_k)` is one
lookup into a `(H, n_q + n_k - 1)` profile, then a Toeplitz view.
"""

from __future__ import annotations

import torch
from torch import nn

from posprobe.mechanisms.base import (
    LayerShape,
    PositionalMechanism,
    clip,
    offset_range,
    register,
    reset_parameter,
    toeplitz,
)
from posprobe.mechanisms.catalogue import Options
from posprobe.mechanisms.flex import clip_bound


@register
class FixedConvolution(PositionalMechanism):
    name = "fixed"

    def __init__(self, shape: LayerShape, options: Options | None = None):
        super().__init__(shape, options)
        self.beta = nn.Parameter(torch.zeros(shape.num_heads, 2 * self.radius + 1))

    def reset(self, init: str = "zero", generator: torch.Generator | None = None) -> None:
        reset_parameter(self.beta, init, generator, 0.5)

    def score_bias(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        n_q, n_k = query.shape[-2], key.shape[-2]
        k = offset_range(n_q, n_k, self.beta.device)
        profile = self.beta[:, k.clamp(-self.radius, self.radius) + self.radius]  # (H, n_q + n_k - 1)
        return toeplitz(profile, n_q, n_k).unsqueeze(0).to(query.dtype)  # (1, H, n_q, n_k)

    def score_mod(self, query: torch.Tensor, key: torch.Tensor):
        beta, r = self.beta.to(query.dtype), clip_bound(self.radius, query.device)  # (H, 2r+1), row kc + r

        def fixed_mod(score, b, h, q_idx, kv_idx):
            return score + beta[h, torch.clamp(kv_idx - q_idx, -r, r) + r]

        return fixed_mod

    def naive_score(self, h, i, j, q_i, k_j):
        return self.beta[h, clip(j - i, self.radius) + self.radius]
