"""Loss across the context and the rotary budget (SPEC §17): pure numpy, no model.

- `cut_windows`: a token stream cut into consecutive non-overlapping windows of L tokens (a BOS first in each).
- `common_targets` / `target_mask`: which stream tokens every length predicts, and where they sit in each length's
  windows, so that every length's perplexity is over exactly the same tokens (SPEC §17).
- `PositionLoss`: float64 sums of -log p(x[t+1] | x[0..t]) per position t = 0..L-2 and integer counts per position
  (the windows that scored it), so that sums from several batches, processes or machines add (SPEC §19); `mean`
  is loss(t), `perplexity` exp of the mean over the scored tokens.
- `token_nll` / `position_nll`: that loss per position from one batch of logits, or from the logits of a block of
  positions and the tokens they predict (float64 out).
- `rotary_budget`: Liu et al. 2023's critical dimension and extrapolation limit, and each pair's wavelength
  against the trained length.
- `octave_means` / `log_smooth`: the loss curve summarised by octaves of position, and smoothed for a log-x figure.

Dimensions: W windows, L tokens per window, V vocabulary, F = d/2 rotary pairs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def cut_windows(stream: Sequence[int], length: int, count: int, bos_id: int | None = None) -> np.ndarray:
    """(count, length) int64: windows i = 0..count-1 of `stream`, consecutive and non-overlapping. With `bos_id`
    each window is [bos] + the next length-1 stream tokens (the BOS takes one of the L); without, the next L.
    ValueError when the stream is too short for `count` windows."""
    body = length - (bos_id is not None)
    if length < 2 or body < 1 or count < 1:
        raise ValueError(f"need length >= 2 (with a BOS) and count >= 1, got length {length}, count {count}")
    if len(stream) < body * count:
        raise ValueError(f"the stream has {len(stream)} tokens, fewer than {count} windows of {body}")
    tokens = np.asarray(stream[: body * count], dtype=np.int64).reshape(count, body)
    if bos_id is None:
        return tokens
    return np.concatenate([np.full((count, 1), bos_id, dtype=np.int64), tokens], axis=1)


def common_targets(covered: int, lengths: Sequence[int], with_bos: bool) -> np.ndarray:
    """(covered,) bool over stream tokens s = 0..covered-1: those that every length's windows predict. With a BOS
    each window's BOS predicts its first stream token, so every s is predicted at every length; without one, a
    window's first token is never predicted, so s that starts a window at some length L (s % L == 0) is left out
    at every length."""
    keep = np.ones(int(covered), dtype=bool)
    if not with_bos:
        s = np.arange(int(covered))
        for length in lengths:
            keep &= s % int(length) != 0
    return keep


def target_mask(common: np.ndarray, length: int, count: int, with_bos: bool) -> np.ndarray:
    """(count, length-1) bool: whether loss position t of window w predicts a token of `common`, i.e. stream token
    s = w (L - b) + t + 1 - b (b = 1 with a BOS) with s < len(common) and common[s]. Windows reaching past the
    common tokens score only their part before it."""
    b = int(with_bos)
    s = np.arange(count)[:, None] * (length - b) + np.arange(length - 1)[None, :] + 1 - b  # (count, L-1)
    inside = s < len(common)
    return inside & common[np.minimum(s, len(common) - 1)]


def windows_available(stream_length: int, length: int, with_bos: bool) -> int:
    """How many windows of `length` tokens a stream of `stream_length` tokens gives."""
    return stream_length // (length - with_bos)


def token_nll(logits, input_ids) -> np.ndarray:
    """(B, L-1) float64: -log p(x[t+1] | x[0..t]) = logsumexp(logits[t]) - logits[t, x[t+1]] from logits (B, L, V)
    (torch) and input_ids (B, L): `position_nll` of the logits at positions 0..L-2 and the tokens 1..L-1."""
    return position_nll(logits[:, :-1], input_ids[:, 1:])


def position_nll(scores, targets) -> np.ndarray:
    """(B, T) float64: logsumexp(scores[b, t]) - scores[b, t, targets[b, t]] from logits (B, T, V) (torch) and the
    tokens they predict (B, T), as (max - scores[t, target]) + log sum exp(scores[t] - max): the first term exact in
    float64, the second (between 0 and log V) in the logits' own precision, so the error stays below 1e-6 nats
    whatever the logits' size (tested against float64); no float64 copy of the logits is made (a float64
    log-softmax cost 3x the time of this, and more than 10 % of a forward pass)."""
    import torch

    targets = targets.to(scores.device)
    picked = scores.gather(-1, targets[..., None])[..., 0]
    peak = scores.max(-1).values  # exact in any precision
    spread = torch.empty(picked.shape, dtype=torch.float64, device=scores.device)
    chunk = max(16, scores.shape[1] // 8)  # the temporary below: an eighth of the logits
    for start in range(0, scores.shape[1], chunk):
        part = scores[:, start : start + chunk]
        spread[:, start : start + chunk] = (part - peak[:, start : start + chunk, None]).exp().sum(-1).log()
    return (peak.double() - picked.double() + spread).cpu().numpy()  # loss = (max - x_target) + log sum exp(x - max)


class PositionLoss:
    """Running float64 sums of the loss at each position t = 0..L-2 over windows, the count of losses summed at each
    position, and the number of windows.

    `add(nll, mask)` takes (B, L-1) losses and optionally which of them to score (B, L-1) bool (default all);
    `merge` adds another PositionLoss (or all-reduced arrays) of the same L."""

    def __init__(self, length: int):
        self.length = int(length)
        self.sums = np.zeros(self.length - 1, dtype=np.float64)  # (L-1,)
        self.counts = np.zeros(self.length - 1, dtype=np.int64)  # (L-1,) losses summed at each t
        self.windows = 0

    def add(self, nll: np.ndarray, mask: np.ndarray | None = None) -> None:
        nll = np.asarray(nll, dtype=np.float64)
        if nll.ndim != 2 or nll.shape[1] != self.length - 1:
            raise ValueError(f"expected losses (B, {self.length - 1}), got {nll.shape}")
        mask = np.ones(nll.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
        if mask.shape != nll.shape:
            raise ValueError(f"the mask {mask.shape} does not match the losses {nll.shape}")
        self.sums += np.where(mask, nll, 0.0).sum(0)
        self.counts += mask.sum(0)
        self.windows += nll.shape[0]

    def merge(self, other: PositionLoss) -> PositionLoss:
        if other.length != self.length:
            raise ValueError("position losses of different lengths do not add")
        self.sums += other.sums
        self.counts += other.counts
        self.windows += other.windows
        return self

    @property
    def scored(self) -> int:
        """How many losses were summed (tokens scored)."""
        return int(self.counts.sum())

    @property
    def mean(self) -> np.ndarray:
        """loss(t) (L-1,): the mean over the windows that scored t (NaN where none did)."""
        if self.windows == 0:
            raise ValueError("no window was added")
        return np.divide(self.sums, self.counts, out=np.full(self.sums.shape, np.nan), where=self.counts > 0)

    @property
    def perplexity(self) -> float:
        """exp of the mean loss over the scored tokens."""
        if self.scored == 0:
            raise ValueError("no token was scored")
        return float(np.exp(self.sums.sum() / self.scored))


def critical_dimension(rotated_dims: int, theta: float, trained_length: float) -> int:
    """d_extra = 2 ceil((d/2) log_theta(T / 2 pi)), clipped to [0, d]: the dims below it complete a full period
    within T tokens (Liu et al. 2023)."""
    value = 2 * math.ceil((rotated_dims / 2) * math.log(trained_length / (2 * math.pi)) / math.log(theta))
    return int(min(max(value, 0), rotated_dims))


def rotary_budget(rotated_dims: int, theta: float, trained_length: int, inv_freq: dict | None = None) -> dict:
    """The rotary budget (SPEC §17) of d rotated dims with base theta, trained on T tokens: `critical_dimension`
    d_extra, `extrapolation_limit` T_extra = 2 pi theta^(d_extra / d) (the wavelength of the first pair that does
    not complete a period in T), and per variant (`inv_freq`: name -> (F,) radians per token) each pair's
    wavelength 2 pi / theta_f and how many exceed T."""
    d_extra = critical_dimension(rotated_dims, theta, trained_length)
    budget = {
        "rotated_dims": int(rotated_dims),
        "rope_theta": float(theta),
        "trained_length": int(trained_length),
        "critical_dimension": d_extra,
        "extrapolation_limit": float(2 * math.pi * theta ** (d_extra / rotated_dims)),
        "pairs": int(rotated_dims // 2),
        "pairs_with_full_period": d_extra // 2,
    }
    variants = []
    for name, freq in (inv_freq or {}).items():
        lengths = 2 * np.pi / np.asarray(freq, dtype=np.float64)
        variants.append({
            "variant": name,
            "wavelengths": [float(x) for x in lengths],
            "pairs_beyond_trained_length": int((lengths > trained_length).sum()),
            "longest_wavelength": float(lengths.max()),
        })  # fmt: skip
    budget["variants"] = variants
    return budget


def perplexity_interval(window_sums, window_counts, level: float = 0.95) -> tuple[float, float]:
    """(low, high): a `level` interval of the perplexity exp(L), L = sum of the losses / tokens scored, over the
    windows as independent units: L is a ratio of window sums, its standard error the cluster (ratio-estimator)
    one, se² = n / (n - 1) * sum_w (s_w - L c_w)² / (sum_w c_w)², with Student's t at n - 1 degrees of freedom,
    mapped through exp. `window_sums` (W,) each window's summed loss, `window_counts` (W,) its tokens scored;
    windows that scored nothing are left out; (NaN, NaN) with fewer than two windows."""
    from scipy import stats

    sums, counts = np.asarray(window_sums, dtype=np.float64), np.asarray(window_counts, dtype=np.float64)
    kept = counts > 0
    sums, counts = sums[kept], counts[kept]
    n = len(sums)
    if n < 2:
        return float("nan"), float("nan")
    total = counts.sum()
    mean = sums.sum() / total
    se = math.sqrt(n / (n - 1) * float(((sums - mean * counts) ** 2).sum())) / total
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * se
    return math.exp(mean - half), math.exp(mean + half)


def octave_edges(length: int) -> np.ndarray:
    """Position bins [1, 2), [2, 4), ..., up to L-1 (t = 0 alone first): edges (K+1,) of t."""
    edges = [0, 1]
    while edges[-1] < length - 1:
        edges.append(min(edges[-1] * 2, length - 1))
    return np.asarray(edges)


def octave_means(loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(edges (K+1,), means (..., K)) of loss (..., L-1) over t in [edges[k], edges[k+1])."""
    edges = octave_edges(loss.shape[-1] + 1)
    means = np.stack([loss[..., a:b].mean(-1) for a, b in zip(edges[:-1], edges[1:])], axis=-1)
    return edges, means


def log_smooth(loss: np.ndarray, bins_per_octave: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """(t, mean loss) of loss (L-1,) in geometric position bins (`bins_per_octave` per doubling of t+1): a smooth
    curve for a log-x axis. t is the mean position of each non-empty bin."""
    positions = np.arange(1, loss.shape[-1] + 1)  # t + 1 >= 1
    edges = np.unique(np.floor(2 ** np.arange(0, np.log2(positions[-1]) + 1 / bins_per_octave, 1 / bins_per_octave)))
    index = np.searchsorted(edges, positions, side="right") - 1
    counts = np.bincount(index)
    keep = counts > 0
    t = np.bincount(index, weights=positions - 1.0)[keep] / counts[keep]
    return t, np.bincount(index, weights=loss)[keep] / counts[keep]
