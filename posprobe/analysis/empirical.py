"""Empirical positional profiles from text (SPEC §10): streaming accumulators over attention scores.

Pure computation: tensors in, arrays out; the model is run elsewhere (`posprobe.capture`, which hands every batch to
`EmpiricalAccumulator.add` as a reducer).
Dimensions: B batch, L layers, H heads, m the batch's sequence length, n = max length (m <= n).
Convention: query/row i attends to key/column j; offset k = j - i; profiles over k = -(n-1)..n-1 increasing.

What is kept per layer (memory set by these, never by the corpus):
- `score_sum` (L, H, n, n) float64: sum of the pre-softmax score S(i, j) over counted pairs, the numerator of the
  mean score matrix M; its diagonal sums give the score profile s(k);
- `prob_sum` (L, H, 2n-1) float64: sum of A(i, j) over counted pairs at each offset k (a(k), mean distance);
- `prob_without_first_sum` (L, H, 2n-1) float64: the same over the counted pairs with i >= 1 and j >= 1 (key 0 and
  query 0 left out, no renormalisation): a(k) without the first token, whose sink otherwise enters every offset;
  its pair counts are the diagonal sums of `count[:, 1:, 1:]`;
- `count` (L, n, n) int64: counted pairs per (i, j) (the same for every head);
- `queries` (L,) int64: query tokens with at least one counted pair.
A pair (b, i, j) is counted when the model lets query i see key j (its mask: padding, causality, windows) and both
tokens are real (and not special tokens, when excluded). Every pair weighs the same (pooled means).
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


def centre_offsets(values: torch.Tensor, n: int) -> torch.Tensor:
    """Place (..., 2m-1) per-offset values (k = -(m-1)..m-1) into (..., 2n-1), zeros outside."""
    m = (values.shape[-1] + 1) // 2
    if m == n:
        return values
    out = values.new_zeros(*values.shape[:-1], 2 * n - 1)
    out[..., n - m : n + m - 1] = values
    return out


class EmpiricalAccumulator:
    """Running sums for every layer and head: a capture reducer (`add` one batch, `result` at the end).

    n_layers, n_heads, max_length n; `device` where the sums live (the model's device).
    """

    needs = ("scores", "probs")
    # added over torchrun ranks (SPEC §19)
    rank_sums = ("score_sum", "prob_sum", "prob_without_first_sum", "count", "queries")

    def __init__(self, n_layers: int, n_heads: int, max_length: int, device: str | torch.device = "cpu"):
        import torch

        self.n_layers, self.n_heads, self.n = int(n_layers), int(n_heads), int(max_length)
        n, L, H = self.n, self.n_layers, self.n_heads
        self.score_sum = torch.zeros(L, H, n, n, dtype=torch.float64, device=device)
        self.prob_sum = torch.zeros(L, H, 2 * n - 1, dtype=torch.float64, device=device)
        self.prob_without_first_sum = torch.zeros(L, H, 2 * n - 1, dtype=torch.float64, device=device)
        self.count = torch.zeros(L, n, n, dtype=torch.int64, device=device)
        self.queries = torch.zeros(L, dtype=torch.int64, device=device)

    @staticmethod
    def nbytes(n_layers: int, n_heads: int, max_length: int) -> int:
        """Memory the accumulators take (bytes)."""
        n = max_length
        return 8 * (n_layers * n_heads * (n * n + 2 * (2 * n - 1)) + n_layers * (n * n + 1))

    def add(self, batch) -> None:
        """Add every layer of one batch (a `posprobe.capture.BatchCapture`: scores, probs, counted_pairs)."""
        for layer in range(self.n_layers):
            self.add_layer(layer, batch.scores[layer], batch.probs[layer], batch.counted_pairs[layer])

    def add_layer(self, layer: int, scores: torch.Tensor, probs: torch.Tensor, counted: torch.Tensor) -> None:
        """Add one layer of one batch: `scores` S and `probs` A (B, H, m, m); `counted` (B, m, m) bool."""
        import torch

        m = scores.shape[-1]
        if m > self.n or scores.shape[-2] != m:
            raise ValueError(f"scores of shape {tuple(scores.shape)} do not fit max_length {self.n}")
        weight = counted.to(scores.dtype)[:, None]  # (B, 1, m, m)
        # where() rather than a product: masked scores may be -inf or the dtype's minimum
        s = torch.where(counted[:, None], scores, 0).sum(0, dtype=torch.float64)  # (H, m, m)
        a = (probs * weight).sum(0, dtype=torch.float64)  # (H, m, m)
        self.score_sum[layer, :, :m, :m] += s
        self.prob_sum[layer] += centre_offsets(offset_sums(a), self.n)
        if m > 1:  # pairs with i >= 1 and j >= 1: the same offsets k = j - i, one row and column fewer
            self.prob_without_first_sum[layer] += centre_offsets(offset_sums(a[:, 1:, 1:]), self.n)
        self.count[layer, :m, :m] += counted.sum(0)
        self.queries[layer] += counted.any(-1).sum()

    def result(self) -> EmpiricalProfiles:
        return empirical_profiles(
            self.score_sum.cpu().numpy(),
            self.prob_sum.cpu().numpy(),
            self.count.cpu().numpy(),
            self.queries.cpu().numpy(),
            self.prob_without_first_sum.cpu().numpy(),
        )


@dataclass(frozen=True)
class EmpiricalProfiles:
    """SPEC §10 per layer and head. Arrays (NaN where no pair has the offset / entry):

    offsets (2n-1,) k = j - i increasing; score_profiles s(k), prob_profiles a(k) (L, H, 2n-1);
    prob_profiles_without_first (L, H, 2n-1): a(k) over the pairs with i >= 1 and j >= 1 (no renormalisation; a
    first-token sink no longer pools into every offset); pair_counts_without_first (L, 2n-1);
    pair_counts c(k) (L, 2n-1) (identical rows unless layers mask differently, e.g. sliding windows);
    mean_distance (L, H): mean over counted queries of sum_j A(i, j)|j - i|; mean_scores M (L, H, n, n);
    count_matrix (L, n, n); toeplitz_r2 (L, H): R^2 of M over the entries with data (NaN when undefined);
    n_queries (L,).
    """

    offsets: np.ndarray
    score_profiles: np.ndarray
    prob_profiles: np.ndarray
    pair_counts: np.ndarray
    mean_distance: np.ndarray
    mean_scores: np.ndarray
    count_matrix: np.ndarray
    toeplitz_r2: np.ndarray
    n_queries: np.ndarray
    prob_profiles_without_first: np.ndarray | None = None
    pair_counts_without_first: np.ndarray | None = None


def empirical_profiles(
    score_sum: np.ndarray,
    prob_sum: np.ndarray,
    count: np.ndarray,
    queries: np.ndarray,
    prob_without_first_sum: np.ndarray | None = None,
) -> EmpiricalProfiles:
    """The SPEC §10 quantities from the accumulated sums (shapes as in `EmpiricalAccumulator`)."""
    L, H, n, _ = score_sum.shape
    pair_counts = offset_sums(count)  # (L, 2n-1)
    later = np.zeros_like(count)
    later[:, 1:, 1:] = count[:, 1:, 1:]
    pair_counts_later = offset_sums(later)  # (L, 2n-1): pairs with i >= 1 and j >= 1
    score_diag = offset_sums(score_sum)  # (L, H, 2n-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        denom = np.where(pair_counts > 0, pair_counts, np.nan)[:, None, :]
        score_profiles = score_diag / denom
        prob_profiles = prob_sum / denom
        prob_later = None
        if prob_without_first_sum is not None:
            prob_later = prob_without_first_sum / np.where(pair_counts_later > 0, pair_counts_later, np.nan)[:, None]
        k = np.abs(np.arange(-(n - 1), n))
        q = np.where(queries > 0, queries, np.nan).astype(np.float64)
        mean_distance = (prob_sum * k).sum(-1) / q[:, None]
        mean_scores = score_sum / np.where(count > 0, count, np.nan)[:, None]
    has_data = np.broadcast_to((count > 0)[:, None], mean_scores.shape)
    return EmpiricalProfiles(
        np.arange(-(n - 1), n),
        score_profiles,
        prob_profiles,
        pair_counts,
        mean_distance,
        mean_scores,
        count,
        masked_toeplitz_r2(np.nan_to_num(mean_scores), has_data),
        np.asarray(queries),
        prob_later,
        pair_counts_later,
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
    enough = profiles.pair_counts[:, None, :] >= min_pairs  # (L, 1, 2n-1)
    return profile_correlation(np.where(enough, profiles.score_profiles, np.nan), weights_profiles)
