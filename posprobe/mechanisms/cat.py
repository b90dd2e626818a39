"""CAT: convolution-augmented attention (SPEC §6): `Q = (F_q * X) W_q`, `K = (F_k * X) W_k`, `V = (F_v * X) W_v`.

Centred depthwise filters along the sequence, one bank `(d, 2r+1)` per role: `3*d*(2r+1)` parameters per
depth, stored as `filters` `(3, d, 2r+1)` (query, key, value). Dirac (identity) initialisation leaves the
model unchanged. Applied by a forward pre-hook on each projection (the input is rewritten; the pretrained
projection then runs as usual). Padded tokens are zeroed before filtering.
"""

from __future__ import annotations

import torch
from torch import nn

from posprobe.mechanisms._sequence import depthwise_along_sequence, dirac, naive_filter, zero_padding
from posprobe.mechanisms.base import LayerShape, PositionalMechanism, ROLES, register, reset_parameter


@register
class ConvolutionAugmentedAttention(PositionalMechanism):
    name = "cat"
    summary = "centred depthwise filters on the Q/K/V inputs (Dirac init), 3*d*(2r+1) per layer"
    transforms_inputs = True

    def __init__(self, shape: LayerShape, *, radius: int = 8, kernels: int = 5):
        super().__init__(shape, radius=radius, kernels=kernels)
        self.filters = nn.Parameter(torch.zeros(3, shape.input_size, 2 * self.radius + 1))

    def reset(self, init: str = "zero", generator: torch.Generator | None = None) -> None:
        reset_parameter(self.filters, init, generator, 0.1, dirac(self.shape.input_size, self.radius))

    def transform_inputs(self, role: str, x: torch.Tensor, key_valid: torch.Tensor | None) -> torch.Tensor:
        return depthwise_along_sequence(zero_padding(x, key_valid), self.filters[ROLES.index(role)])

    def naive_inputs(self, role, x, valid):
        return naive_filter(x, self.filters[ROLES.index(role)], valid)
