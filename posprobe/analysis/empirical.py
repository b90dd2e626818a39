"""Empirical positional profiles from text (SPEC §10): streaming accumulators over attention scores.

Pure computation: tensors in, arrays out; the model is run elsewhere (`posprobe.capture`, which hands every batch to
`EmpiricalAccumulator.add` as a reducer).
Dimensions: B batch, L layers, H heads, m the batch's sequence length, n = max length (m <= n).
Convention: query/row i attends to key/column j; offset k = j - i; profiles over k = -(n-1)..n-1 increasing.

What is kept per layer (memory set by these, never by the corpus), all summed one block of query rows at a time
(`add_block`: rows i0..i0+b-1 against every key, so a capture may hand over (b x m) slices instead of m x m
matrices; an offset sum is a sum over diagonals, and a block holds a piece of each):
- `score_offset_sum` (L, H, 2n-1) float64: sum of the pre-softmax score S(i, j) over counted pairs at each offset k
  (the score profile s(k));
- `prob_sum` (L, H, 2n-1) float64: sum of A(i, j) over counted pairs at each offset k (a(k), mean distance);
- `prob_without_first_sum` (L, H, 2n-1) float64: the same over the counted pairs with i >= 1 and j >= 1 (key 0 and
  query 0 left out, no renormalisation): a(k) without the first token, whose sink otherwise enters every offset;
- `pair_sum` and `pair_without_first_sum` (L, 2n-1) int64: counted pairs at each offset (all; i, j >= 1);
- `queries` (L,) int64: query tokens with at least one counted pair;
- only with `mean_scores` (the default): `score_sum` (L, H, n, n) float64, the numerator of the mean score matrix M,
  and `count` (L, n, n) int64, counted pairs per (i, j) (the same for every head). These two are the only n x n
  sums; without them memory is linear in n, and M, the count matrix and M's Toeplitz R^2 are not produced.
A pair (b, i, j) is counted when the model lets query i see key j (its mask: padding, causality, windows) and both
tokens are real (and not special tokens, when excluded). Every pair weighs the same (pooled means).
Where a layer's heads pick keys of their own (`head_masks`: MiniMax M3's block indexer per key-head group; counted
pairs (B, H, b, m)), the counts are also kept per head, `head_pair_sum` and `head_pair_without_first_sum` (L, H,
2n-1), `head_queries` (L, H) and, with `mean_scores`, `head_count` (L, H, n, n), and each head's means divide by
its own; the per-layer counts are then those of the pairs some head of the layer attends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def offset_sums(x):
    """Sums of `x` (..., m, m) along each diagonal k = j - i, as (..., 2m-1) with k increasing from -(m-1).

    numpy array or torch tensor in, the same kind out. One reshape, no index tensor: flip the columns, pad each
    row to 2m, and read the buffer with rows of 2m-1: entry (i, j) lands in row i, column i + (m-1-j) = (m-1) - k.
    """
    m = x.shape[-1]
    lead = tuple(x.shape[:-2])
    if isinstance(x, np.ndarray):
        flipped = np.concatenate([x[..., ::-1], np.zeros(lead + (m, m), dtype=x.dtype)], axis=-1)  # (..., m, 2m)
        skewed = flipped.reshape(lead + (2 * m * m,))[..., : m * (2 * m - 1)].reshape(lead + (m, 2 * m - 1))
        return skewed.sum(-2)[..., ::-1]
    import torch

    flipped = torch.nn.functional.pad(x.flip(-1), (0, m))  # (..., m, 2m)
    skewed = flipped.reshape(*lead, 2 * m * m)[..., : m * (2 * m - 1)].reshape(*lead, m, 2 * m - 1)
    return skewed.sum(-2).flip(-1)


def block_offset_sums(x, row0: int, col0: int, n: int):
    """Sums of the (..., b, w) block `x` of a larger matrix (its entry (r, c) is the matrix's (row0 + r, col0 + c))
    along each offset k = j - i, placed into (..., 2n-1) with k increasing from -(n-1); torch tensors.

    The skew of `offset_sums` on the block: flip the columns, pad each row to w + b, read with rows of w + b - 1;
    entry (r, c) lands at column r + (w-1-c), that is, after flipping back, at c - r + (b-1)."""
    import torch

    b, w = x.shape[-2], x.shape[-1]
    lead = tuple(x.shape[:-2])
    flipped = torch.nn.functional.pad(x.flip(-1), (0, b))  # (..., b, w + b)
    skewed = flipped.reshape(*lead, b * (w + b))[..., : b * (w + b - 1)].reshape(*lead, b, w + b - 1)
    sums = skewed.sum(-2).flip(-1)  # (..., w + b - 1): index u holds k = u - (b-1) + col0 - row0
    first = (n - 1) - (b - 1) + col0 - row0  # where u = 0 lands in the (2n-1) output
    out = sums.new_zeros(*lead, 2 * n - 1)
    lo, hi = max(first, 0), min(first + w + b - 1, 2 * n - 1)
    if hi > lo:
        out[..., lo:hi] = sums[..., lo - first : hi - first]
    return out


def centre_offsets(values: torch.Tensor, n: int) -> torch.Tensor:
    """Place (..., 2m-1) per-offset values (k = -(m-1)..m-1) into (..., 2n-1), zeros outside."""
    m = (values.shape[-1] + 1) // 2
    if m == n:
        return values
    out = values.new_zeros(*values.shape[:-1], 2 * n - 1)
    out[..., n - m : n + m - 1] = values
    return out


class EmpiricalAccumulator:
    """Running sums for every layer and head: a capture reducer (`add` one batch, or `add_block` one block of query
    rows of one layer; `result` at the end).

    n_layers, n_heads, max_length n; `device` where the sums live (the model's device); `mean_scores`: keep the
    n x n sums of the mean score matrix M (memory quadratic in n) or not (memory linear in n); `head_masks`: keep
    the counts per head too (a model whose layers may have a mask per head, module docstring).
    """

    needs = ("scores", "probs")

    def __init__(
        self,
        n_layers: int,
        n_heads: int,
        max_length: int,
        device: str | torch.device = "cpu",
        mean_scores: bool = True,
        head_masks: bool = False,
    ):
        import torch

        self.n_layers, self.n_heads, self.n = int(n_layers), int(n_heads), int(max_length)
        self.mean_scores, self.head_masks = bool(mean_scores), bool(head_masks)
        n, L, H = self.n, self.n_layers, self.n_heads
        zeros = lambda *shape, dtype=torch.float64: torch.zeros(*shape, dtype=dtype, device=device)  # noqa: E731
        self.score_offset_sum = zeros(L, H, 2 * n - 1)
        self.prob_sum = zeros(L, H, 2 * n - 1)
        self.prob_without_first_sum = zeros(L, H, 2 * n - 1)
        self.pair_sum = zeros(L, 2 * n - 1, dtype=torch.int64)
        self.pair_without_first_sum = zeros(L, 2 * n - 1, dtype=torch.int64)
        self.queries = zeros(L, dtype=torch.int64)
        self.score_sum = zeros(L, H, n, n) if self.mean_scores else None
        self.count = zeros(L, n, n, dtype=torch.int64) if self.mean_scores else None
        heads = self.head_masks
        self.head_pair_sum = zeros(L, H, 2 * n - 1, dtype=torch.int64) if heads else None
        self.head_pair_without_first_sum = zeros(L, H, 2 * n - 1, dtype=torch.int64) if heads else None
        self.head_queries = zeros(L, H, dtype=torch.int64) if heads else None
        self.head_count = zeros(L, H, n, n, dtype=torch.int64) if heads and self.mean_scores else None
        # added over torchrun ranks (SPEC §19)
        self.rank_sums = ("score_offset_sum", "prob_sum", "prob_without_first_sum", "pair_sum")
        self.rank_sums += ("pair_without_first_sum", "queries") + (("score_sum", "count") if self.mean_scores else ())
        if heads:
            self.rank_sums += ("head_pair_sum", "head_pair_without_first_sum", "head_queries")
            self.rank_sums += ("head_count",) if self.mean_scores else ()

    @staticmethod
    def nbytes(n_layers: int, n_heads: int, max_length: int, mean_scores: bool = True, head_masks: bool = False) -> int:
        """Memory the accumulators take (bytes)."""
        n = max_length
        linear = 8 * (3 * n_layers * n_heads * (2 * n - 1) + n_layers * (2 * (2 * n - 1) + 1))
        square = 8 * (n_layers * n_heads + n_layers) * n * n if mean_scores else 0
        if head_masks:  # the counts per head
            linear += 8 * n_layers * n_heads * (2 * (2 * n - 1) + 1)
            square += 8 * n_layers * n_heads * n * n if mean_scores else 0
        return linear + square

    def add(self, batch) -> None:
        """Add every layer of one batch (a `posprobe.capture.BatchCapture`: scores, probs, counted_pairs), as one
        block of all its query rows."""
        for layer in range(self.n_layers):
            self.add_layer(layer, batch.scores[layer], batch.probs[layer], batch.counted_pairs[layer])

    def add_layer(self, layer: int, scores: torch.Tensor, probs: torch.Tensor, counted: torch.Tensor) -> None:
        """Add one layer of one batch: `scores` S and `probs` A (B, H, m, m); `counted` (B, m, m) bool."""
        if scores.shape[-2] != scores.shape[-1]:
            raise ValueError(f"scores of shape {tuple(scores.shape)} are not (queries x keys) of one sequence")
        self.add_rows(layer, 0, scores, probs, counted)

    def add_block(self, block) -> None:
        """Add one block of query rows of one layer (a `posprobe.capture.BlockCapture`)."""
        self.add_rows(block.layer, block.start, block.scores, block.probs, block.counted_pairs)

    def add_rows(
        self, layer: int, start: int, scores: torch.Tensor, probs: torch.Tensor, counted: torch.Tensor
    ) -> None:
        """Add query rows start..start+b-1 of one layer against every key: `scores` S and `probs` A (B, H, b, m),
        `counted` (B, b, m) bool, or (B, H, b, m) where the layer's heads pick keys of their own (`head_masks`)."""
        import torch

        b, m = scores.shape[-2], scores.shape[-1]
        if m > self.n or start < 0 or start + b > m:
            raise ValueError(
                f"rows {start}..{start + b - 1} of scores {tuple(scores.shape)} do not fit max_length {self.n}"
            )
        if counted.dim() == 4 and not self.head_masks:
            raise ValueError("counted pairs per head need EmpiricalAccumulator(head_masks=True)")
        n = self.n
        per_head = counted if counted.dim() == 4 else counted[:, None]  # (B, H or 1, b, m)
        weight = per_head.to(scores.dtype)
        # where() rather than a product: masked scores may be -inf or the dtype's minimum
        s = torch.where(per_head, scores, 0).sum(0, dtype=torch.float64)  # (H, b, m)
        a = (probs * weight).sum(0, dtype=torch.float64)  # (H, b, m)
        c = (per_head.any(1) if counted.dim() == 4 else counted).sum(0)  # (b, m) int64: pairs some head counts
        self.score_offset_sum[layer] += block_offset_sums(s, start, 0, n)
        self.prob_sum[layer] += block_offset_sums(a, start, 0, n)
        self.pair_sum[layer] += block_offset_sums(c, start, 0, n)
        skip = 1 if start == 0 else 0  # pairs with i >= 1 and j >= 1: row 0 (if in this block) and column 0 left out
        if b > skip and m > 1:
            self.prob_without_first_sum[layer] += block_offset_sums(a[:, skip:, 1:], start + skip, 1, n)
            self.pair_without_first_sum[layer] += block_offset_sums(c[skip:, 1:], start + skip, 1, n)
        self.queries[layer] += per_head.any(1).any(-1).sum()
        if self.head_masks:  # each head's own counts ((1, ...) broadcast where the layer has one mask)
            c_head = per_head.sum(0)  # (H or 1, b, m)
            self.head_pair_sum[layer] += block_offset_sums(c_head, start, 0, n)
            if b > skip and m > 1:
                self.head_pair_without_first_sum[layer] += block_offset_sums(c_head[:, skip:, 1:], start + skip, 1, n)
            self.head_queries[layer] += per_head.any(-1).sum((0, 2))
            if self.mean_scores:
                self.head_count[layer, :, start : start + b, :m] += c_head
        if self.mean_scores:
            self.score_sum[layer, :, start : start + b, :m] += s
            self.count[layer, start : start + b, :m] += c

    def result(self) -> EmpiricalProfiles:
        numpy = lambda t: None if t is None else t.cpu().numpy()  # noqa: E731
        return empirical_profiles(
            numpy(self.score_sum),
            self.prob_sum.cpu().numpy(),
            numpy(self.count),
            self.queries.cpu().numpy(),
            self.prob_without_first_sum.cpu().numpy(),
            score_offset_sum=self.score_offset_sum.cpu().numpy(),
            pair_sum=self.pair_sum.cpu().numpy(),
            pair_without_first_sum=self.pair_without_first_sum.cpu().numpy(),
            head_counts=None
            if not self.head_masks
            else (
                self.head_pair_sum.cpu().numpy(),
                self.head_pair_without_first_sum.cpu().numpy(),
                self.head_queries.cpu().numpy(),
                numpy(self.head_count),
            ),
        )


@dataclass(frozen=True)
class EmpiricalProfiles:
    """SPEC §10 per layer and head. Arrays (NaN where no pair has the offset / entry):

    offsets (2n-1,) k = j - i increasing; score_profiles s(k), prob_profiles a(k) (L, H, 2n-1);
    prob_profiles_without_first (L, H, 2n-1): a(k) over the pairs with i >= 1 and j >= 1 (no renormalisation; a
    first-token sink no longer pools into every offset); pair_counts_without_first (L, 2n-1);
    pair_counts c(k) (L, 2n-1) (identical rows unless layers mask differently, e.g. sliding windows);
    mean_distance (L, H): mean over counted queries of sum_j A(i, j)|j - i|; mean_scores M (L, H, n, n);
    count_matrix (L, n, n); toeplitz_r2 (L, H): R^2 of M over the entries with data (NaN when undefined); these
    three are None when the n x n sums were not kept (`EmpiricalAccumulator(mean_scores=False)`); n_queries (L,).
    head_pair_counts (L, H, 2n-1): each head's own pair counts, for a model whose layers may pick keys per head
    (`EmpiricalAccumulator(head_masks=True)`: its profiles, distances and M divide by each head's own counts;
    pair_counts, count_matrix and n_queries are then those of the pairs some head attends), else None.
    """

    offsets: np.ndarray
    score_profiles: np.ndarray
    prob_profiles: np.ndarray
    pair_counts: np.ndarray
    mean_distance: np.ndarray
    mean_scores: np.ndarray | None
    count_matrix: np.ndarray | None
    toeplitz_r2: np.ndarray | None
    n_queries: np.ndarray
    prob_profiles_without_first: np.ndarray | None = None
    pair_counts_without_first: np.ndarray | None = None
    head_pair_counts: np.ndarray | None = None  # (L, H, 2n-1) where a layer's heads pick keys of their own


def empirical_profiles(
    score_sum: np.ndarray | None,
    prob_sum: np.ndarray,
    count: np.ndarray | None,
    queries: np.ndarray,
    prob_without_first_sum: np.ndarray | None = None,
    *,
    score_offset_sum: np.ndarray | None = None,
    pair_sum: np.ndarray | None = None,
    pair_without_first_sum: np.ndarray | None = None,
    head_counts: tuple | None = None,
) -> EmpiricalProfiles:
    """The SPEC §10 quantities from the accumulated sums (shapes as in `EmpiricalAccumulator`). The per-offset sums
    (`score_offset_sum`, `pair_sum`, `pair_without_first_sum`) are the diagonal sums of `score_sum` / `count` when
    those are given (and taken from them when the offset sums are not); without `score_sum` and `count` (no n x n
    sums kept) mean_scores, count_matrix and toeplitz_r2 are None. `head_counts`: (pairs (L, H, 2n-1), pairs
    without the first token (L, H, 2n-1), queries (L, H), count (L, H, n, n) or None), each head's own, which then
    divide each head's sums."""
    if count is not None:
        later = np.zeros_like(count)
        later[:, 1:, 1:] = count[:, 1:, 1:]
        pair_counts = offset_sums(count) if pair_sum is None else pair_sum  # (L, 2n-1)
        pair_counts_later = offset_sums(later) if pair_without_first_sum is None else pair_without_first_sum
    else:
        pair_counts, pair_counts_later = pair_sum, pair_without_first_sum
    score_diag = offset_sums(score_sum) if score_offset_sum is None else score_offset_sum  # (L, H, 2n-1)
    n = (prob_sum.shape[-1] + 1) // 2
    # the counts each head's sums divide by: the layer's, or each head's own
    pairs, pairs_later, head_queries, head_count = (
        (pair_counts[:, None], None if pair_counts_later is None else pair_counts_later[:, None],
         np.asarray(queries)[:, None], None if count is None else count[:, None])
        if head_counts is None
        else head_counts
    )  # fmt: skip
    with np.errstate(invalid="ignore", divide="ignore"):
        denom = np.where(pairs > 0, pairs, np.nan)
        score_profiles = score_diag / denom
        prob_profiles = prob_sum / denom
        prob_later = None
        if prob_without_first_sum is not None:
            prob_later = prob_without_first_sum / np.where(pairs_later > 0, pairs_later, np.nan)
        k = np.abs(np.arange(-(n - 1), n))
        q = np.where(head_queries > 0, head_queries, np.nan).astype(np.float64)
        mean_distance = (prob_sum * k).sum(-1) / q
        mean_scores = None if score_sum is None else score_sum / np.where(head_count > 0, head_count, np.nan)
    r2 = None
    if mean_scores is not None:
        has_data = np.broadcast_to(head_count > 0, mean_scores.shape)
        r2 = masked_toeplitz_r2(np.nan_to_num(mean_scores), has_data)
    return EmpiricalProfiles(
        np.arange(-(n - 1), n),
        score_profiles,
        prob_profiles,
        pair_counts,
        mean_distance,
        mean_scores,
        count,
        r2,
        np.asarray(queries),
        prob_later,
        pair_counts_later,
        None if head_counts is None else head_counts[0],
    )


# Relative size of the total sum of squares below which R^2 is undefined: float64 round-off of a constant matrix
# leaves TSS around (1e-16 * scale)^2 * entries; 1e-20 of the scale^2 * entries is far above that and far below
# any real variation.
_TSS_RELATIVE_FLOOR = 1e-20


def masked_toeplitz_r2(matrices: np.ndarray, has_data: np.ndarray) -> np.ndarray:
    """Toeplitz R^2 (SPEC §2) of each (..., n, n) matrix over the entries where `has_data` is True.

    The fit puts on each diagonal k the unweighted mean of the entries with data; RSS and TSS run over the same
    entries. NaN where fewer than two entries have data or their total sum of squares is (numerically) zero.
    """
    w = np.asarray(has_data, dtype=np.float64)
    m = np.asarray(matrices, dtype=np.float64) * w
    n = m.shape[-1]
    entries = w.sum((-2, -1))
    diag_n = offset_sums(w)
    diag_mean = offset_sums(m) / np.maximum(diag_n, 1)
    i = np.arange(n)
    k_index = (i[None, :] - i[:, None]) + (n - 1)  # (n, n): index of offset j - i
    fitted = diag_mean[..., k_index]  # (..., n, n)
    rss = (((m - fitted) * w) ** 2).sum((-2, -1))
    mean = m.sum((-2, -1)) / np.maximum(entries, 1)
    tss = (((m - mean[..., None, None]) * w) ** 2).sum((-2, -1))
    scale = np.maximum((m**2).sum((-2, -1)) / np.maximum(entries, 1), 1e-300)
    undefined = (entries < 2) | (tss <= _TSS_RELATIVE_FLOOR * scale * entries)
    with np.errstate(invalid="ignore", divide="ignore"):
        r2 = 1 - rss / tss
    return np.where(undefined, np.nan, r2)


def profile_correlation(empirical: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Pearson correlation per head between two (..., K) profiles over the offsets where both are finite.

    NaN where fewer than 3 such offsets exist or either profile is constant there."""
    ok = np.isfinite(empirical) & np.isfinite(weights)
    cnt = ok.sum(-1)
    x = np.where(ok, empirical, 0.0)
    y = np.where(ok, weights, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mx = x.sum(-1) / cnt
        my = y.sum(-1) / cnt
        dx = np.where(ok, x - mx[..., None], 0.0)
        dy = np.where(ok, y - my[..., None], 0.0)
        sxx, syy, sxy = (dx * dx).sum(-1), (dy * dy).sum(-1), (dx * dy).sum(-1)
        r = sxy / np.sqrt(sxx * syy)
    tiny = 1e-24
    undefined = (
        (cnt < 3) | (sxx <= tiny * np.maximum(1.0, (x * x).sum(-1))) | (syy <= tiny * np.maximum(1.0, (y * y).sum(-1)))
    )
    return np.where(undefined, np.nan, np.clip(r, -1.0, 1.0))


def correlation_with_weights(profiles: EmpiricalProfiles, weights_profiles: np.ndarray, min_pairs: int) -> np.ndarray:
    """(L, H) Pearson r between the score profile s(k) and the weights-based profile (L, H, 2n-1) of each head, over
    the offsets whose pair count c(k) in that layer is at least `min_pairs` (an offset resting on a few pairs would
    otherwise weigh as much as one resting on thousands). NaN where fewer than 3 offsets qualify."""
    counts = profiles.pair_counts[:, None, :] if profiles.head_pair_counts is None else profiles.head_pair_counts
    enough = counts >= min_pairs  # (L, 1 or H, 2n-1)
    return profile_correlation(np.where(enough, profiles.score_profiles, np.nan), weights_profiles)
