"""Learned attention sinks (gpt-oss): the share of each query's attention a head's learned sink logit takes.

A head with a learned sink adds one logit s_h to every query's softmax, a column with no key and no value:
A(i, j) = exp(S(i, j)) / (exp(s_h) + sum_j' exp(S(i, j'))) over the keys j the query may see, so the row sums to
`real_token_share` = sum_j A(i, j) < 1 and the sink takes `learned_sink_share` = 1 - sum_j A(i, j). These are not
SPEC §14's first-token mass (attention on the key at position 0, a real token): a learned sink needs no token.
Entries pooled over blocks of tokens in the same softmax (DeepSeek V4's compressed layers) are no real tokens: their
share is in `learned_sink_share` too.

Pure computation: a capture reducer (`LearnedSinkAccumulator`: `add` one `posprobe.capture.BatchCapture`, `result`
at the end) and the same shares of content-free scores (`content_free_sink_share`). Dimensions: B batch, L layers,
H heads, m the batch's sequence length, n positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LearnedSinkShares:
    """Over counted query tokens (every real token, position 0 included; each weighs the same), per layer and head
    (L, H): `learned_sink_share` the mean share the sink takes, `real_token_share` the mean share left to real
    tokens (the two add to 1); `n_queries` how many queries were counted."""

    learned_sink_share: np.ndarray
    real_token_share: np.ndarray
    n_queries: int


class LearnedSinkAccumulator:
    """Running sums of the share left to real tokens, per layer and head (float64, on `device`)."""

    needs = ("probs",)

    def __init__(self, n_layers: int, n_heads: int, device: str | torch.device = "cpu"):
        import torch

        self.n_layers, self.n_heads = int(n_layers), int(n_heads)
        self.real = torch.zeros(self.n_layers, self.n_heads, dtype=torch.float64, device=device)
        self.queries = 0

    def add(self, batch) -> None:
        """Add every layer of one batch (a BatchCapture: probs (B, H, m, m) per layer, counted (B, m))."""
        for layer in range(self.n_layers):
            self.add_rows(layer, 0, batch.probs[layer], batch.counted)

    def add_block(self, block) -> None:
        """Add one block of query rows of one layer (a `posprobe.capture.BlockCapture`)."""
        self.add_rows(block.layer, block.start, block.probs, block.tokens.counted)

    def add_rows(self, layer: int, start: int, probs, counted) -> None:
        """Add query rows start..start+b-1 of one layer: probs (B, H, b, m), counted (B, m) (the batch's counted
        tokens; its rows' count is added with layer 0)."""
        import torch

        queries = counted[:, start : start + probs.shape[-2]]  # (B, b)
        if layer == 0:
            self.queries += int(queries.sum())
        row_mass = probs.sum(-1, dtype=torch.float64)  # (B, H, b): masked keys hold 0
        self.real[layer] += (row_mass * queries[:, None]).sum((0, 2))

    def result(self) -> LearnedSinkShares:
        real = self.real.cpu().numpy() / self.queries if self.queries else np.full(tuple(self.real.shape), np.nan)
        return LearnedSinkShares(1.0 - real, real, self.queries)


def content_free_sink_share(scores: np.ndarray, sink_logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """The sink's share of each query's attention under content-free scores: F̂ (H, n, n) (row i = query, column
    j = key), sink logits (H,), allowed (n, n) bool (the pairs the layer's mask lets attend: causality, window).
    Returns (H, n): exp(s_h) / (exp(s_h) + sum_{j allowed} exp(F̂(i, j))), computed stably in float64."""
    scores = np.where(allowed[None], np.asarray(scores, dtype=np.float64), -np.inf)
    sink = np.asarray(sink_logits, dtype=np.float64)[:, None]  # (H, 1)
    top = np.maximum(scores.max(-1), sink)  # (H, n)
    keys = np.exp(scores - top[..., None]).sum(-1)
    own = np.exp(sink - top)
    return own / (own + keys)
