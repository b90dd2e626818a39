"""Shaw et al. relative value term (SPEC §5): `z_i = sum_j alpha_ij (v_j + a_V[kc])`.

Table `a_V` `(2r+1, d_h)` shared by the heads of a layer. Efficient form: the probabilities `(B, H, n_q, n_k)`
are summed per offset bucket into `(B, H, n_q, 2r+1)` (scatter-add by the cached `kc + r` index, expanded
as a view), then one matmul with `a_V`. Needs the probabilities, so this mechanism runs the explicit path.
"""

from __future__ import annotations

import torch
from torch import nn

from posprobe.mechanisms.base import LayerShape, PositionalMechanism, clip, clipped_index, register, reset_parameter
from posprobe.mechanisms.catalogue import Options


@register
class ShawValues(PositionalMechanism):
    name = "shaw-values"
    needs_probabilities = True

    def __init__(self, shape: LayerShape, options: Options | None = None):
        super().__init__(shape, options)
        self.a_v = nn.Parameter(torch.zeros(2 * self.radius + 1, shape.head_dim))

    def reset(self, init: str = "zero", generator: torch.Generator | None = None) -> None:
        reset_parameter(self.a_v, init, generator, 0.5)

    def value_term(self, probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        n_q, n_k = probs.shape[-2:]
        index = clipped_index(n_q, n_k, self.radius, probs.device)
        buckets = probs.new_zeros(*probs.shape[:-1], 2 * self.radius + 1)
        buckets = buckets.scatter_add(-1, index.expand_as(probs), probs)  # (B, H, n_q, 2r+1)
        return torch.matmul(buckets, self.a_v.to(probs.dtype))

    def naive_value(self, h, i, j):
        return self.a_v[clip(j - i, self.radius) + self.radius]
