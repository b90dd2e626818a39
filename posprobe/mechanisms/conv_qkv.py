"""Convolutional Q/K/V (seed paper §5): depthwise-separable convolutions replace the projections of half the heads.

For each role (query, key, value) and the last `H // 2` heads (`m = (H//2)*d_h` output channels): a centred
depthwise filter bank `(d, 2r+1)` along the sequence, then a pointwise projection `(m, d)` + bias `(m)`.
Parameters per depth: `3*(d*(2r+1) + m*d + m)`. Identity init: Dirac filters and the pointwise projection copied
from the original projection rows of those heads (`attach`), so outputs are unchanged. The original rows stay
in the checkpoint but no longer influence the output. Applied by a forward hook on each projection.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from posprobe.mechanisms._sequence import depthwise_along_sequence, dirac, naive_filter, zero_padding
from posprobe.mechanisms.base import ROLES, LayerShape, PositionalMechanism, register, reset_parameter
from posprobe.mechanisms.catalogue import Options


@register
class ConvolutionalQKV(PositionalMechanism):
    name = "conv-qkv"
    transforms_projections = True

    def __init__(self, shape: LayerShape, options: Options | None = None):
        super().__init__(shape, options)
        d, self.m = shape.input_size, (shape.num_heads // 2) * shape.head_dim
        self.depthwise = nn.Parameter(torch.zeros(3, d, 2 * self.radius + 1))
        self.pointwise = nn.Parameter(torch.zeros(3, self.m, d))
        self.pointwise_bias = nn.Parameter(torch.zeros(3, self.m))

    def reset(self, init: str = "zero", generator: torch.Generator | None = None) -> None:
        reset_parameter(self.depthwise, init, generator, 0.1, dirac(self.shape.input_size, self.radius))

    def attach(self, attention: nn.Module) -> None:
        if self.m == 0:
            return
        with torch.no_grad():
            for r, role in enumerate(ROLES):
                linear: nn.Linear = getattr(attention, role)
                self.pointwise[r].copy_(linear.weight[-self.m :])
                if linear.bias is not None:
                    self.pointwise_bias[r].copy_(linear.bias[-self.m :])

    def transform_projection(
        self, role: str, x: torch.Tensor, out: torch.Tensor, key_valid: torch.Tensor | None
    ) -> torch.Tensor:
        if self.m == 0:
            return out
        r = ROLES.index(role)
        y = depthwise_along_sequence(zero_padding(x, key_valid), self.depthwise[r])
        conv = F.linear(y, self.pointwise[r].to(x.dtype), self.pointwise_bias[r].to(x.dtype))  # (B, n, m)
        return torch.cat([out[..., : out.shape[-1] - self.m], conv], dim=-1)

    def naive_projection(self, role, x, linear, valid):
        out = F.linear(x, linear.weight, linear.bias).clone()
        if self.m:
            r = ROLES.index(role)
            y = naive_filter(x, self.depthwise[r], valid)
            out[:, -self.m :] = y @ self.pointwise[r].t() + self.pointwise_bias[r]
        return out
