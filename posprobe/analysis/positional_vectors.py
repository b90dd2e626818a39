"""Positional vectors (SPEC §16, Dong et al. 2024): the mean hidden state at each position, minus their mean.

Pure computation: a capture reducer (`PositionalVectorAccumulator`: `add` one `posprobe.capture.BatchCapture`,
`result` at the end), tensors in, arrays out. Dimensions: B batch, m its longest sequence, n = max length (m <= n),
L+1 hidden states (l = 0 the embedding output, as transformers' `output_hidden_states` returns them), d hidden size.

For hidden state l and position i: `p_l(i)` = mean over texts of `h_l(t, i)` (real tokens: every text that reaches
position i), kept where at least `min_texts` texts do; `v_l(i) = p_l(i) - mean_i p_l(i)` over the kept positions.
With right padding, the kept positions are 0..n_kept-1. Their Gram matrix `V V^T` (n_kept x n_kept) gets the
Toeplitz R² of SPEC §2; `|v_l(i)|` are the norms. Memory: the sums (L+1, n, d) float64 and the counts (n,).

The first token apart: in models with massive activations (SPEC §16) p_l(0) is orders of magnitude larger than the
other means, so it dominates V V^T (its R² then says little about the other positions) and, through the mean it
shifts, every |v_l(i)|. The same quantities are also given over the kept positions i >= 1 alone:
`v'_l(i) = p_l(i) - mean_{i >= 1} p_l(i)` (= v_l(i) minus its mean over i >= 1), their norms, Gram matrix and R²,
as SPEC §13 leaves position 0 out of its mean for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from posprobe.analysis.toeplitz import toeplitz_r2

if TYPE_CHECKING:
    import torch

DEFAULT_MIN_TEXTS = 16


class PositionalVectorAccumulator:
    """Running sums of the hidden states per layer and position over real tokens (float64, on `device`)."""

    needs = ("hidden_states",)
    rank_sums = ("sums", "counts")  # added over torchrun ranks (SPEC §19)

    def __init__(self, n_states: int, n_positions: int, hidden_size: int, device: str | torch.device = "cpu"):
        import torch

        self.n_states, self.n_positions = int(n_states), int(n_positions)
        self.sums = torch.zeros(self.n_states, self.n_positions, int(hidden_size), dtype=torch.float64, device=device)
        self.counts = torch.zeros(self.n_positions, dtype=torch.int64, device=device)

    @staticmethod
    def nbytes(n_states: int, n_positions: int, hidden_size: int) -> int:
        return 8 * n_states * n_positions * hidden_size

    def add(self, batch) -> None:
        """Add one batch (a BatchCapture: hidden_states, real)."""
        import torch

        real = batch.real  # (B, m)
        m = real.shape[1]
        self.counts[:m] += real.sum(0)
        for layer, hidden in enumerate(batch.hidden_states):  # (B, m, d)
            # selected, not multiplied by a 0/1 weight: padding may hold NaN or inf, and 0 * NaN is NaN
            self.sums[layer, :m] += torch.where(real[..., None], hidden.to(torch.float64), 0.0).sum(0)

    def result(self, min_texts: int = DEFAULT_MIN_TEXTS) -> PositionalVectors:
        return positional_vectors(self.sums.cpu().numpy(), self.counts.cpu().numpy(), min_texts)


@dataclass(frozen=True)
class PositionalVectors:
    """vectors (L+1, n, d): v_l(i), NaN rows at positions not kept; norms (L+1, n): |v_l(i)| (NaN where not
    kept); gram (L+1, n_kept, n_kept): V V^T over the kept positions; toeplitz_r2 (L+1,): the Gram matrix's
    Toeplitz R² (NaN when fewer than 2 positions are kept or it is constant); counts (n,): texts per position;
    kept (n,) bool; min_texts: the threshold. The same without the first token (positions 1..n_kept-1, recentred
    over them): norms_without_first (L+1, n) (NaN at 0), gram_without_first (L+1, n_kept-1, n_kept-1),
    toeplitz_r2_without_first (L+1,)."""

    vectors: np.ndarray
    norms: np.ndarray
    gram: np.ndarray
    toeplitz_r2: np.ndarray
    counts: np.ndarray
    kept: np.ndarray
    min_texts: int
    norms_without_first: np.ndarray
    gram_without_first: np.ndarray
    toeplitz_r2_without_first: np.ndarray

    @property
    def n_kept(self) -> int:
        return int(self.kept.sum())


def positional_vectors(sums: np.ndarray, counts: np.ndarray, min_texts: int = DEFAULT_MIN_TEXTS) -> PositionalVectors:
    """SPEC §16's positional vectors from the sums (L+1, n, d) of hidden states per position and the number of
    texts (n,) at each position."""
    sums = np.asarray(sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    kept = counts >= max(int(min_texts), 1)  # a prefix 0..n_kept-1 under right padding
    n_states, n, d = sums.shape
    means = sums[:, kept] / counts[kept][None, :, None]  # (L+1, n_kept, d)
    vectors, norms, gram, r2 = _centred(means, kept, n)
    later = kept & (np.arange(n) >= 1)
    _, norms_later, gram_later, r2_later = _centred(means[:, 1:], later, n)
    return PositionalVectors(vectors, norms, gram, r2, counts, kept, int(min_texts), norms_later, gram_later, r2_later)


def _centred(means: np.ndarray, where: np.ndarray, n: int):
    """Positional vectors of `means` (L+1, k, d) at the positions `where` (n,) (k of them): (vectors (L+1, n, d),
    norms (L+1, n), Gram (L+1, k, k), Toeplitz R² (L+1,)), NaN outside `where`."""
    n_states, k, d = means.shape
    centred = means - means.mean(axis=1, keepdims=True) if k else means
    vectors = np.full((n_states, n, d), np.nan)
    vectors[:, where] = centred
    gram = centred @ centred.transpose(0, 2, 1)
    r2 = toeplitz_r2(gram) if k >= 2 else np.full(n_states, np.nan)
    return vectors, np.linalg.norm(vectors, axis=-1), gram, np.asarray(r2, dtype=np.float64)
