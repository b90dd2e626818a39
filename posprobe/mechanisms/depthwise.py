"""Fixed depthwise convolution of the values, added after softmax (seed paper §4, SPEC §5).

`z_i += sum_j beta[kc, c] * v_j[c]` over real keys `j`, per channel `c = h*d_h + e`, `kc = clip(j - i, -r, r)`.
Table `beta` `(2r+1, H*d_h)`: `(2r+1)*d` parameters per depth. Because offsets are clipped, every key farther
than `r` shares the edge weight `beta[±r]`. Efficient form: a windowed depthwise conv for `|k| < r` plus
prefix/suffix sums for the two clipped edges — `O(n d)`, no `n x n` tensor at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from posprobe.mechanisms._sequence import depthwise_channels_first
from posprobe.mechanisms.base import LayerShape, PositionalMechanism, clip, register, reset_parameter
from posprobe.mechanisms.catalogue import Options


@register
class DepthwiseConvolution(PositionalMechanism):
    name = "depthwise"
    has_output_term = True

    def __init__(self, shape: LayerShape, options: Options | None = None):
        super().__init__(shape, options)
        self.beta = nn.Parameter(torch.zeros(2 * self.radius + 1, shape.inner_size))

    def reset(self, init: str = "zero", generator: torch.Generator | None = None) -> None:
        reset_parameter(self.beta, init, generator, 0.1)

    def output_term(self, value: torch.Tensor, key_valid: torch.Tensor | None) -> torch.Tensor:
        B, H, n, dh = value.shape
        r = self.radius
        if key_valid is not None:
            value = value * key_valid[:, None, :, None].to(value.dtype)
        v = value.permute(0, 1, 3, 2).reshape(B, H * dh, n)  # (B, d, n), channel c = h*d_h + e
        beta = self.beta.to(value.dtype)
        inner = depthwise_channels_first(v, beta[1 : 2 * r].t())  # |k| < r
        prefix = v.cumsum(-1)  # sum_{j <= t}
        suffix = v.flip(-1).cumsum(-1).flip(-1)  # sum_{j >= t}
        left = F.pad(prefix, (r, 0))[..., :n]  # sum_{j <= i - r}
        right = F.pad(suffix, (0, r))[..., r:]  # sum_{j >= i + r}
        out = inner + beta[0][:, None] * left + beta[2 * r][:, None] * right
        return out.view(B, H, dh, n).permute(0, 1, 3, 2)

    def naive_output(self, h, i, j, v_j):
        dh = self.shape.head_dim
        return self.beta[clip(j - i, self.radius) + self.radius, h * dh : (h + 1) * dh] * v_j
