"""Composite attention (seed paper Eq. 6): self-attention + dynamic + fixed lightweight convolution."""

from __future__ import annotations

import torch

from posprobe.mechanisms.base import LayerShape, PositionalMechanism, register
from posprobe.mechanisms.catalogue import Options
from posprobe.mechanisms.dynamic import DynamicConvolution
from posprobe.mechanisms.fixed import FixedConvolution
from posprobe.mechanisms.flex import sum_mods


@register
class CompositeAttention(PositionalMechanism):
    name = "composite"

    def __init__(self, shape: LayerShape, options: Options | None = None):
        super().__init__(shape, options)
        self.dynamic = DynamicConvolution(shape, self.options)
        self.fixed = FixedConvolution(shape, self.options)

    def reset(self, init: str = "zero", generator: torch.Generator | None = None) -> None:
        self.dynamic.reset(init, generator)
        self.fixed.reset(init, generator)

    def score_bias(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        return self.dynamic.score_bias(query, key) + self.fixed.score_bias(query, key)

    def score_mod(self, query: torch.Tensor, key: torch.Tensor):
        return sum_mods([self.dynamic.score_mod(query, key), self.fixed.score_mod(query, key)])

    def naive_score(self, h, i, j, q_i, k_j):
        return self.dynamic.naive_score(h, i, j, q_i, k_j) + self.fixed.naive_score(h, i, j, q_i, k_j)
