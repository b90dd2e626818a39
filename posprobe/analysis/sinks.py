"""Attention sinks (SPEC §14): how much attention goes to the first token and to special tokens, the mean attention
distance without the first token, and the distances uniform attention would give on the same texts.

Pure computation: a capture reducer (`SinkAccumulator`: `add` one `posprobe.capture.BatchCapture`, or `add_block`
one block of query rows of one layer; `result` at the end), tensors in, arrays out; every measure is a sum over
query rows, so blocks of rows give the same sums as whole matrices. Dimensions: B batch, L layers, H heads, m the
batch's sequence length, b the rows of a block.
Query i attends to key j; the first token is position 0 (right padding: every text starts there).

Sink queries: counted tokens (real; not special when special tokens are excluded) at positions i >= 1 (a query at
0 can only see 0 in a causal model). Over them, every query weighing the same:
- first-token mass = mean of A(i, 0) over the sink queries that may see key 0 (per layer: a sliding window or a
  chunk hides key 0 from later queries, whose A(i, 0) = 0 says nothing about a sink); special-token mass = mean of
  the sum of A(i, j) over special keys j over all sink queries (NaN when the texts hold no special token: a
  tokenizer that adds none leaves nothing to measure, not a mass of 0);
- uniform first-token mass (per layer) = mean of 1 / (number of keys the query may see) over the same queries as
  the first-token mass: what uniform attention would put on key 0, the reference for the first-token mass and the
  sink threshold (short texts give uniform masses near the threshold; a sink is a head far above it);
- distance without the first token = mean of sum_{j>=1} A(i,j)|j-i| / sum_{j>=1} A(i,j), over the counted pairs
  (i, j) the model lets attend (a query whose A(i, j>=1) is all zero is left out);
- sink rate of a layer = share of its heads whose first-token mass exceeds `threshold` (0.3, Gu et al. 2025).
Uniform references (per layer: masks such as sliding windows may differ between layers): the distances a head
would have if every query attended uniformly over the keys it may see (its counted pairs):
- `uniform_distance`: mean over the queries of SPEC §10's mean attention distance (counted tokens with a counted
  pair, position 0 included) of mean_j |j - i| — what `mean_distance` equals for uniform attention;
- `uniform_distance_without_first`: mean over sink queries of mean_{j>=1} |j - i| — the reference for
  `distance_without_first`.
Where a layer's heads pick keys of their own (`head_masks`: MiniMax M3's block indexer per key-head group; allowed
and counted pairs (B, H, b, m)), "the keys the query may see" are the head's: the per-layer references and query
counts (first-token queries, uniform masses and distances) are then kept per head, (L, H).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

SINK_THRESHOLD = 0.3


class SinkAccumulator:
    """Running sums of the SPEC §14 measures for every layer and head (float64, on `device`)."""

    needs = ("probs",)
    rank_sums = (  # added over torchrun ranks (SPEC §19)
        "first",
        "first_queries",
        "uniform_first",
        "special",
        "without_first",
        "without_first_queries",
        "sink_queries",
        "special_tokens",
        "uniform",
        "uniform_queries",
        "uniform_without_first",
        "uniform_without_first_queries",
    )

    def __init__(
        self,
        n_layers: int,
        n_heads: int,
        device: str | torch.device = "cpu",
        threshold: float = SINK_THRESHOLD,
        head_masks: bool = False,
    ):
        import torch

        self.n_layers, self.n_heads, self.threshold = int(n_layers), int(n_heads), float(threshold)
        self.head_masks = bool(head_masks)
        L, H = self.n_layers, self.n_heads
        zeros = lambda *shape: torch.zeros(*shape, dtype=torch.float64, device=device)  # noqa: E731
        layer = (L, H) if self.head_masks else (L,)  # a reference per layer, or per head (module docstring)
        self.first = zeros(L, H)  # sum over sink queries that may see key 0 of A(i, 0)
        self.first_queries = zeros(*layer)  # sink queries that may see key 0
        self.uniform_first = zeros(*layer)  # sum over them of 1 / (keys the query may see)
        self.special = zeros(L, H)  # ... of sum_{j special} A(i, j)
        self.without_first = zeros(L, H)  # ... of the distance without the first token
        self.without_first_queries = zeros(L, H)
        self.sink_queries = 0
        self.special_tokens = 0  # special tokens among the real tokens
        self.uniform = zeros(*layer)  # sum over §10 queries of mean_j |j - i|
        self.uniform_queries = zeros(*layer)
        self.uniform_without_first = zeros(*layer)  # sum over sink queries of mean_{j>=1} |j - i|
        self.uniform_without_first_queries = zeros(*layer)

    def add(self, batch) -> None:
        """Add every layer of one batch (a BatchCapture: probs, counted_pairs, allowed, counted, special,
        positions), as one block of all its query rows."""
        for layer in range(self.n_layers):
            self.add_rows(layer, 0, batch.probs[layer], batch.allowed[layer], batch.counted_pairs[layer], batch.tokens)

    def add_block(self, block) -> None:
        """Add one block of query rows of one layer (a `posprobe.capture.BlockCapture`)."""
        self.add_rows(block.layer, block.start, block.probs, block.allowed, block.counted_pairs, block.tokens)

    def add_rows(self, layer: int, start: int, probs, allowed, pairs, tokens) -> None:
        """Add query rows start..start+b-1 of one layer: probs (B, H, b, m), allowed and pairs (counted pairs)
        (B, b, m) bool, or (B, H, b, m) where the layer's heads pick keys of their own (`head_masks`), `tokens` the
        batch's `TokenBatch` (counted, special, real, positions (B, m)). The batch's query and special-token counts
        are added with layer 0."""
        import torch

        b, m = probs.shape[-2], probs.shape[-1]
        if allowed.dim() == 4 and not self.head_masks:
            raise ValueError("allowed pairs per head need SinkAccumulator(head_masks=True)")
        if allowed.dim() == 3:  # one mask for every head: a head axis of 1
            allowed, pairs = allowed[:, None], pairs[:, None]
        rows = slice(start, start + b)
        queries = tokens.counted[:, rows] & (tokens.positions[:, rows] >= 1)  # (B, b) sink queries
        if layer == 0:
            self.sink_queries += int(queries.sum())
            if start == 0:
                self.special_tokens += int((tokens.special & tokens.real).sum())
        at = torch.arange(m, device=probs.device)
        distance = (at[None, :] - at[start : start + b, None]).abs()  # (b, m) |j - i|
        later = at >= 1  # keys j >= 1
        special = tokens.special.to(probs.dtype)[:, None, :, None]  # (B, 1, m, 1)
        sees_first = queries[:, None] & allowed[..., 0]  # (B, H or 1, b)
        self.first[layer] += (probs[..., 0] * sees_first).sum((0, 2), dtype=torch.float64)
        on_special = torch.matmul(probs, special)[..., 0]  # (B, H, b)
        self.special[layer] += (on_special * queries[:, None]).sum((0, 2), dtype=torch.float64)
        pairs_later = pairs & later  # (B, H or 1, b, m)
        weight = pairs_later.to(probs.dtype)
        mass = (probs * weight).sum(-1, dtype=torch.float64)  # (B, H, b)
        moment = (probs * (weight * distance)).sum(-1, dtype=torch.float64)
        ok = queries[:, None] & (mass > 0)
        self.without_first[layer] += torch.where(ok, moment / torch.where(ok, mass, 1.0), 0.0).sum((0, 2))
        self.without_first_queries[layer] += ok.sum((0, 2))
        keys = (allowed & tokens.real[:, None, None, :]).sum(-1)  # (B, H or 1, b) keys each query may see
        total, count = _uniform(pairs, distance, None)
        total_later, count_later = _uniform(pairs_later, distance, queries[:, None])
        first = torch.where(sees_first, 1.0 / keys.clamp(min=1).to(torch.float64), 0.0).sum((0, 2))
        for name, value in (("uniform_first", first), ("first_queries", sees_first.sum((0, 2))), ("uniform", total),
                            ("uniform_queries", count), ("uniform_without_first", total_later),
                            ("uniform_without_first_queries", count_later)):  # fmt: skip
            getattr(self, name)[layer] += value if self.head_masks else value.sum()  # (H or 1,): per head, or one

    def result(self) -> SinkMeasures:
        return sink_measures(
            self.first.cpu().numpy(),
            self.special.cpu().numpy(),
            self.without_first.cpu().numpy(),
            self.without_first_queries.cpu().numpy(),
            self.sink_queries,
            self.uniform.cpu().numpy(),
            self.uniform_queries.cpu().numpy(),
            self.uniform_without_first.cpu().numpy(),
            self.uniform_without_first_queries.cpu().numpy(),
            self.threshold,
            self.special_tokens,
            self.first_queries.cpu().numpy(),
            self.uniform_first.cpu().numpy(),
        )


def _uniform(pairs: torch.Tensor, distance: torch.Tensor, queries: torch.Tensor | None):
    """Per head, (sum over queries of mean_j |j - i| over the pairs, number of queries) (H or 1,) each: queries
    with at least one pair (and among `queries` when given). pairs (B, H or 1, b, m) bool, distance (b, m),
    queries (B, 1, b)."""
    import torch

    keys = pairs.sum(-1)  # (B, H, b)
    spread = (pairs * distance).sum(-1)  # (B, H, b)
    ok = keys > 0 if queries is None else queries & (keys > 0)
    mean = spread.to(torch.float64) / torch.where(ok, keys, 1)
    return torch.where(ok, mean, 0.0).sum((0, 2)), ok.sum((0, 2))


@dataclass(frozen=True)
class SinkMeasures:
    """SPEC §14 per layer and head (NaN where no query counts):

    first_token_mass, special_token_mass, distance_without_first (L, H); sink_rate (L,): share of heads with
    first-token mass > threshold; uniform_distance, uniform_distance_without_first (L,): the references for
    `mean_distance` (SPEC §10) and `distance_without_first`; n_queries: sink queries (counted tokens at i >= 1);
    n_special_tokens: special tokens among the real tokens (none: special_token_mass is NaN, not measured);
    uniform_first_token_mass (L,): the first-token mass of uniform attention over the same queries (the reference
    for first_token_mass and the threshold); first_token_queries (L,): the sink queries that may see key 0, over
    which first_token_mass is taken (fewer than n_queries in sliding-window or chunked layers). The four (L,)
    references (uniform distances, uniform first-token mass, first-token queries) are (L, H), each head's, where a
    layer's heads pick keys of their own (`SinkAccumulator(head_masks=True)`).
    """

    first_token_mass: np.ndarray
    special_token_mass: np.ndarray
    distance_without_first: np.ndarray
    sink_rate: np.ndarray
    uniform_distance: np.ndarray
    uniform_distance_without_first: np.ndarray
    n_queries: int
    threshold: float = SINK_THRESHOLD
    n_special_tokens: int | None = None  # None: not counted (measures built by hand)
    uniform_first_token_mass: np.ndarray | None = None
    first_token_queries: np.ndarray | None = None

    @property
    def first_token_ratio(self) -> np.ndarray | None:
        """(L, H) first-token mass / the uniform first-token mass of its layer (1: no more than uniform)."""
        if self.uniform_first_token_mass is None:
            return None
        uniform = self.uniform_first_token_mass
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.first_token_mass / (uniform[:, None] if uniform.ndim == 1 else uniform)


def sink_measures(
    first: np.ndarray,
    special: np.ndarray,
    without_first: np.ndarray,
    without_first_queries: np.ndarray,
    sink_queries: int,
    uniform: np.ndarray,
    uniform_queries: np.ndarray,
    uniform_without_first: np.ndarray,
    uniform_without_first_queries: np.ndarray,
    threshold: float = SINK_THRESHOLD,
    n_special_tokens: int | None = None,
    first_queries: np.ndarray | None = None,
    uniform_first: np.ndarray | None = None,
) -> SinkMeasures:
    """The SPEC §14 measures from the accumulated sums (shapes as in `SinkAccumulator`); `n_special_tokens` 0 makes
    the special-token mass NaN (there was no special key to attend to). Without `first_queries` (L,) the first-token
    mass is taken over all sink queries (every query may see key 0)."""
    per_query = lambda total, count: total / np.where(count > 0, count, np.nan)  # noqa: E731
    first_count = np.float64(sink_queries) if first_queries is None else np.asarray(first_queries, np.float64)
    first_mass = per_query(first, first_count[:, None] if np.ndim(first_count) == 1 else first_count)  # (L, H)
    rate = sink_rate(first_mass, threshold)
    return SinkMeasures(
        first_mass,
        per_query(special, np.float64(sink_queries)) if n_special_tokens != 0 else np.full_like(first, np.nan),
        per_query(without_first, without_first_queries),
        rate,
        per_query(uniform, uniform_queries),
        per_query(uniform_without_first, uniform_without_first_queries),
        int(sink_queries),
        float(threshold),
        None if n_special_tokens is None else int(n_special_tokens),
        None if uniform_first is None else per_query(np.asarray(uniform_first, np.float64), first_count),
        None if first_queries is None else np.asarray(first_queries, np.int64),
    )


def per_layer(values: np.ndarray | None) -> np.ndarray | None:
    """A reference kept per layer (L,) as it is; one kept per head ((L, H): a layer whose heads pick keys of their
    own, `SinkAccumulator(head_masks=True)`) as the mean over the heads that have one (NaN where none has)."""
    if values is None or np.ndim(values) == 1:
        return values
    values = np.asarray(values, dtype=np.float64)
    counted = np.isfinite(values).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counted > 0, np.nansum(values, -1) / counted, np.nan)


def sink_rate(first_mass: np.ndarray, threshold: float = SINK_THRESHOLD) -> np.ndarray:
    """(L,) share of each layer's heads whose first-token mass (L, H) exceeds `threshold`, over the heads the layer
    has (`fhat.present_heads`: a head NaN where another head of its layer has a mass is absent, SPEC §9, Laguna);
    NaN where a present head has no mass (no query saw the first token, or a hybrid's layer without attention)."""
    from posprobe.analysis.fhat import present_heads

    present = present_heads(first_mass, 0)
    defined = np.where(present, np.isfinite(first_mass), True).all(-1)
    share = ((first_mass > threshold) & present).sum(-1) / present.sum(-1)
    return np.where(defined, share, np.nan)
