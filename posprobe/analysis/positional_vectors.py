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

References (what chance gives):
- Noise floor: a mean over c_i texts carries sampling noise of expected norm sqrt(tr Σ_l(i) / c_i), Σ_l(i) the
  covariance of h_l(t, i) over the texts at position i (from per-position sums of |h|²). A position whose |v_l(i)|
  is below `NOISE_MARGIN` times that floor is `within_noise`: its norm is what averaging alone would leave.
- Permutation null of the Gram matrix's Toeplitz R² (`PermutedPositionAccumulator`): the same positional vectors
  with the positions 1..len_t-1 of each text shuffled (the first token stays at 0; it is known to differ and is
  reported apart), `draws` times, seeded. Counts per position are unchanged, so the null differs from the real
  value only in which token sits where; a real R² inside the null's spread says the Gram matrix's banding is
  what averaging any tokens gives (the Toeplitz fit of a small, noisy Gram matrix is far from 0 by itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from posprobe.analysis.toeplitz import toeplitz_r2

if TYPE_CHECKING:
    import torch

DEFAULT_MIN_TEXTS = 16
NOISE_MARGIN = 2.0  # |v| below this many noise floors: within the noise (pure noise gives about 1)
NULL_DRAWS = 8


class PositionalVectorAccumulator:
    """Running sums of the hidden states per layer and position over real tokens (float64, on `device`)."""

    needs = ("hidden_states",)
    rank_sums = ("sums", "counts", "squares")  # added over torchrun ranks (SPEC §19)

    def __init__(self, n_states: int, n_positions: int, hidden_size: int, device: str | torch.device = "cpu"):
        import torch

        self.n_states, self.n_positions = int(n_states), int(n_positions)
        self.sums = torch.zeros(self.n_states, self.n_positions, int(hidden_size), dtype=torch.float64, device=device)
        self.counts = torch.zeros(self.n_positions, dtype=torch.int64, device=device)
        self.squares = torch.zeros(self.n_states, self.n_positions, dtype=torch.float64, device=device)  # sum |h|²

    @staticmethod
    def nbytes(n_states: int, n_positions: int, hidden_size: int) -> int:
        return 8 * n_states * n_positions * (hidden_size + 1)

    def add(self, batch) -> None:
        """Add one batch (a BatchCapture: hidden_states, real)."""
        import torch

        real = batch.real  # (B, m)
        m = real.shape[1]
        self.counts[:m] += real.sum(0)
        for layer, hidden in enumerate(batch.hidden_states):  # (B, m, d)
            # selected, not multiplied by a 0/1 weight: padding may hold NaN or inf, and 0 * NaN is NaN
            h = torch.where(real[..., None], hidden.to(torch.float64), 0.0)
            self.sums[layer, :m] += h.sum(0)
            self.squares[layer, :m] += (h * h).sum((0, 2))

    def result(self, min_texts: int = DEFAULT_MIN_TEXTS) -> PositionalVectors:
        return positional_vectors(
            self.sums.cpu().numpy(), self.counts.cpu().numpy(), min_texts, self.squares.cpu().numpy()
        )


def permuted_later_positions(text_id: int, length: int, seed: int, draw: int) -> np.ndarray:
    """(length,) where each token of a text goes in null draw `draw`: 0 stays at 0, positions 1..length-1 are
    shuffled by a permutation drawn from (seed, text_id, draw) alone (independent of batches and order)."""
    rest = np.random.default_rng([int(seed), int(text_id), int(draw), 104729]).permutation(max(int(length) - 1, 0))
    return np.concatenate([[0], 1 + rest])[: int(length)]


class PermutedPositionAccumulator:
    """The permutation null of the positional vectors' Gram R²: per draw, the sums of the hidden states at the
    permuted positions (draws, L+1, n, d) float64 (counts per position are those of the real positions)."""

    needs = ("hidden_states",)
    rank_sums = ("sums", "counts")  # added over torchrun ranks (SPEC §19): the permutations depend on the text alone

    def __init__(
        self,
        n_states: int,
        n_positions: int,
        hidden_size: int,
        device: str | torch.device = "cpu",
        draws: int = NULL_DRAWS,
        seed: int = 0,
    ):
        import torch

        self.draws, self.seed, self.n_positions = int(draws), int(seed), int(n_positions)
        shape = (self.draws, int(n_states), self.n_positions, int(hidden_size))
        self.sums = torch.zeros(shape, dtype=torch.float64, device=device)
        self.counts = torch.zeros(self.n_positions, dtype=torch.int64, device=device)

    @staticmethod
    def nbytes(draws: int, n_states: int, n_positions: int, hidden_size: int) -> int:
        return 8 * draws * n_states * n_positions * hidden_size

    def add(self, batch) -> None:
        """Add one batch (a BatchCapture: hidden_states, real, text ids)."""
        import torch

        real = batch.real
        b, i = real.nonzero(as_tuple=True)  # row-major: each text's tokens in order
        self.counts[: real.shape[1]] += real.sum(0)
        if not self.draws:
            return
        states = torch.stack([h[b, i] for h in batch.hidden_states]).to(torch.float64)  # (L+1, N, d)
        lengths = real.sum(1).tolist()
        for r in range(self.draws):
            target = np.concatenate(
                [permuted_later_positions(t, n, self.seed, r) for t, n in zip(batch.text_ids.tolist(), lengths)]
            )
            self.sums[r].index_add_(1, torch.as_tensor(target, device=states.device), states)

    def result(self, min_texts: int = DEFAULT_MIN_TEXTS) -> tuple[np.ndarray, np.ndarray]:
        """(draws, L+1) Toeplitz R² of the permuted positions' Gram matrices: all kept positions, and i >= 1."""
        counts = self.counts.cpu().numpy()
        out = [positional_vectors(self.sums[r].cpu().numpy(), counts, min_texts) for r in range(self.draws)]
        n_states = self.sums.shape[1]
        if not out:
            return np.zeros((0, n_states)), np.zeros((0, n_states))
        return np.stack([v.toeplitz_r2 for v in out]), np.stack([v.toeplitz_r2_without_first for v in out])


@dataclass(frozen=True)
class PositionalVectors:
    """vectors (L+1, n, d): v_l(i), NaN rows at positions not kept; norms (L+1, n): |v_l(i)| (NaN where not
    kept); gram (L+1, n_kept, n_kept): V V^T over the kept positions; toeplitz_r2 (L+1,): the Gram matrix's
    Toeplitz R² (NaN when fewer than 2 positions are kept or it is constant); counts (n,): texts per position;
    kept (n,) bool; min_texts: the threshold. The same without the first token (positions 1..n_kept-1, recentred
    over them): norms_without_first (L+1, n) (NaN at 0), gram_without_first (L+1, n_kept-1, n_kept-1),
    toeplitz_r2_without_first (L+1,). noise_floor (L+1, n): the expected norm of a kept position's mean from
    sampling alone, sqrt(tr Σ_l(i) / c_i) (NaN where not kept or not measured); within_noise (L+1, n) bool: kept
    positions whose |v_l(i)| < NOISE_MARGIN x noise_floor; within_noise_without_first (L+1, n) bool: the same for the
    norms centred over i >= 1 (False at 0) — in a model whose first token is huge, the plain norms all carry its
    share of the mean and never look like noise."""

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
    noise_floor: np.ndarray | None = None
    within_noise: np.ndarray | None = None
    within_noise_without_first: np.ndarray | None = None

    @property
    def n_kept(self) -> int:
        return int(self.kept.sum())


def positional_vectors(
    sums: np.ndarray, counts: np.ndarray, min_texts: int = DEFAULT_MIN_TEXTS, squares: np.ndarray | None = None
) -> PositionalVectors:
    """SPEC §16's positional vectors from the sums (L+1, n, d) of hidden states per position and the number of
    texts (n,) at each position; `squares` (L+1, n), the sums of |h|², give the noise floor."""
    sums = np.asarray(sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    kept = counts >= max(int(min_texts), 1)  # a prefix 0..n_kept-1 under right padding
    n_states, n, d = sums.shape
    means = sums[:, kept] / counts[kept][None, :, None]  # (L+1, n_kept, d)
    vectors, norms, gram, r2 = _centred(means, kept, n)
    later = kept & (np.arange(n) >= 1)
    _, norms_later, gram_later, r2_later = _centred(means[:, 1:], later, n)
    floor = within = within_later = None
    if squares is not None:
        c = counts.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            spread = (np.asarray(squares, np.float64) - (sums**2).sum(-1) / c) / (c - 1)  # tr Σ_l(i), (L+1, n)
            floor = np.where(kept & (counts >= 2), np.sqrt(np.clip(spread, 0, None) / c), np.nan)
        within = kept & (norms < NOISE_MARGIN * floor)
        within_later = later & (norms_later < NOISE_MARGIN * floor)
    return PositionalVectors(vectors, norms, gram, r2, counts, kept, int(min_texts), norms_later, gram_later, r2_later,
                             floor, within, within_later)  # fmt: skip


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
