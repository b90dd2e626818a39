"""CAT: convolution-augmented attention (SPEC §6): `Q = (F_q * X) W_q`, `K = (F_k * X) W_k`, `V = (F_v * X) W_v`.

Centred depthwise filters along the sequence, one bank `(d, 2r+1)` per role: `3*d*(2r+1)` parameters per
depth, stored as `filters` `(3, d, 2r+1)` (query, key, value). Dirac (identity) initialisation leaves the
model unchanged. Applied by a forward pre-hook on each projection (the input is rewritten; the pretrained
projection then runs as usual); the three filterings of a layer run as one grouped convolution. Padded
tokens are zeroed before filtering.
"""

from __future__ import annotations

import torch
from torch import nn

from posprobe.mechanisms._sequence import depthwise_along_sequence, dirac, naive_filter, zero_padding
from posprobe.mechanisms.base import ROLES, LayerShape, PositionalMechanism, register, reset_parameter
from posprobe.mechanisms.catalogue import Options


@register
class ConvolutionAugmentedAttention(PositionalMechanism):
    name = "cat"
    transforms_inputs = True

    def __init__(self, shape: LayerShape, options: Options | None = None):
        super().__init__(shape, options)
        self.filters = nn.Parameter(torch.zeros(3, shape.input_size, 2 * self.radius + 1))
        self._pending: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None  # (input, unused outputs)

    def reset(self, init: str = "zero", generator: torch.Generator | None = None) -> None:
        reset_parameter(self.filters, init, generator, 0.1, dirac(self.shape.input_size, self.radius))

    def transform_inputs(self, role: str, x: torch.Tensor, key_valid: torch.Tensor | None) -> torch.Tensor:
        """The `role` input `(B, n, d)`. The three projections of a layer see the same hidden states, so the
        first call filters them for all three roles in one grouped convolution and the other two take
        their results from `_pending` (kept only until used, or until a different input arrives)."""
        if self._pending is None or self._pending[0] is not x or role not in self._pending[1]:
            self._pending = (x, self._filter_all(zero_padding(x, key_valid)))
        out = self._pending[1].pop(role)
        if not self._pending[1]:
            self._pending = None
        return out

    def _filter_all(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Query, key and value inputs from one depthwise convolution with 3 filters per channel."""
        d = self.shape.input_size
        weight = self.filters.transpose(0, 1).reshape(3 * d, self.filters.shape[-1])  # channel c -> rows 3c..3c+2
        y = depthwise_along_sequence(x, weight, groups=d)  # (B, n, 3d)
        return {role: y[..., i::3] for i, role in enumerate(ROLES)}

    def naive_inputs(self, role, x, valid):
        return naive_filter(x, self.filters[ROLES.index(role)], valid)
