"""Several mechanisms in one retrofit (`--mechanism composite+key-dynamic`, `fixed+shaw-values`).

The parts run side by side in the same attention layer: score biases, value terms and output terms add up;
input and projection rewrites are applied in part order. Parameters live under `parts.{i}.` (part i of
the name), so `posprobe learned` can report each part. Zero init of every part leaves the model unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from posprobe.mechanisms.base import LayerShape, PositionalMechanism
from posprobe.mechanisms.catalogue import CATALOGUE, CombinedOptions, combined_info
from posprobe.mechanisms.flex import has_score_bias, sum_mods


class CombinedMechanism(PositionalMechanism):
    """`parts` = the catalogue mechanisms of `options.parts`, each built with its own options."""

    info = combined_info("tisa+fixed")  # class-level stand-in (options class); instances carry their own

    def __init__(self, shape: LayerShape, options: CombinedOptions | None = None):
        if options is None or not options.parts:
            raise ValueError("CombinedMechanism needs CombinedOptions naming its parts")
        super().__init__(shape, options)
        self.info = combined_info("+".join(options.parts))
        self.name = self.info.name
        self.parts = nn.ModuleList([CATALOGUE[p].load()(shape, options.part_options(p)) for p in options.parts])
        self.needs_probabilities = any(p.needs_probabilities for p in self.parts)
        self.has_output_term = any(p.has_output_term for p in self.parts)
        self.transforms_inputs = any(p.transforms_inputs for p in self.parts)
        self.transforms_projections = any(p.transforms_projections for p in self.parts)
        self.supports_fit = any(p.supports_fit for p in self.parts)

    @staticmethod
    def _sum(terms):
        terms = [t for t in terms if t is not None]
        if not terms:
            return None
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return total

    def score_bias(self, query, key):
        return self._sum(p.score_bias(query, key) for p in self.parts)

    def score_mod(self, query, key):
        return sum_mods([p.score_mod(query, key) for p in self.parts if has_score_bias(p)])

    def value_term(self, probs, value):
        return self._sum(p.value_term(probs, value) for p in self.parts if p.needs_probabilities)

    def output_term(self, value, key_valid):
        return self._sum(p.output_term(value, key_valid) for p in self.parts if p.has_output_term)

    def transform_inputs(self, role, x, key_valid):
        for p in self.parts:
            if p.transforms_inputs:
                x = p.transform_inputs(role, x, key_valid)
        return x

    def transform_projection(self, role, x, out, key_valid):
        for p in self.parts:
            if p.transforms_projections:
                out = p.transform_projection(role, x, out, key_valid)
        return out

    def attach(self, attention: nn.Module) -> None:
        for p in self.parts:
            p.attach(attention)

    def reset(self, init: str = "zero", generator: torch.Generator | None = None) -> None:
        for p in self.parts:
            p.reset(init, generator)

    def load_kernels(self, a, b, c) -> None:
        fit = [p for p in self.parts if p.supports_fit]
        if not fit:
            super().load_kernels(a, b, c)
        fit[0].load_kernels(a, b, c)

    # -- naive references: sums of the parts' terms; input / projection loops chained in part order ------
    def naive_score(self, h, i, j, q_i, k_j):
        return sum(p.naive_score(h, i, j, q_i, k_j) for p in self.parts)

    def naive_value(self, h, i, j):
        return sum(p.naive_value(h, i, j) for p in self.parts)

    def naive_output(self, h, i, j, v_j):
        return sum(p.naive_output(h, i, j, v_j) for p in self.parts)

    def naive_inputs(self, role, x, valid):
        for p in self.parts:
            x = p.naive_inputs(role, x, valid)
        return x

    def naive_projection(self, role, x, linear, valid):
        rewriting = [p for p in self.parts if p.transforms_projections]
        if len(rewriting) > 1:
            raise NotImplementedError("more than one projection-rewriting part has no naive reference")
        return (rewriting[0] if rewriting else super()).naive_projection(role, x, linear, valid)
