"""Comparing mechanisms across seeds (SPEC §12): summaries of one mechanism's per-seed metric values and
paired differences against a baseline run with the same seeds (same data order).

Pure Python + numpy (+ scipy for the t quantile); no torch. Values are per-seed metric values `m_s`,
`None` / NaN where the metric was undefined for a seed (those seeds are left out, pairwise for differences).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

EXACT_MAX_N = 20  # 2^20 sign patterns; above this the p-value is estimated from random sign patterns
MC_PATTERNS = 200_000


@dataclass(frozen=True)
class Summary:
    """median, mean, s.e. = sample s.d. / sqrt(n) (None for n < 2), n = seeds with a defined value."""

    median: float | None
    mean: float | None
    stderr: float | None
    n: int


@dataclass(frozen=True)
class PairedDelta:
    """Paired differences d_s = m_s - baseline_s: mean, s.e., 95% t interval (N-1 d.o.f.; None for n < 2) and
    the exact two-sided sign-flip p-value (`p_exact` False above `EXACT_MAX_N` pairs: Monte Carlo estimate)."""

    mean: float
    stderr: float | None
    ci95: tuple[float, float] | None
    p_value: float
    n: int
    p_exact: bool = True

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ci95"] = None if self.ci95 is None else list(self.ci95)
        return d


def _defined(value) -> bool:
    return value is not None and not math.isnan(float(value))


def summarize(values: Sequence[float | None]) -> Summary:
    """Median, mean and standard error over the seeds where the value is defined."""
    xs = [float(v) for v in values if _defined(v)]
    if not xs:
        return Summary(None, None, None, 0)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None
    return Summary(float(statistics.median(xs)), float(statistics.fmean(xs)), se, len(xs))


def sign_flip_p_value(differences: Sequence[float], *, seed: int = 0) -> tuple[float, bool]:
    """Two-sided sign-flip (paired permutation) p-value of mean(d) = 0: the fraction of the 2^N sign patterns
    e in {-1, +1}^N with |sum(e * d)| >= |sum(d)| (the observed pattern included, so p >= 2 / 2^N when
    d != 0). Exact by enumeration for N <= `EXACT_MAX_N`; else estimated from `MC_PATTERNS` random patterns
    (plus the observed one). Returns (p, exact)."""
    d = np.asarray(differences, dtype=np.float64)
    n = d.size
    if n == 0:
        raise ValueError("no paired differences")
    observed = abs(float(d.sum()))
    tol = 1e-12 * max(1.0, float(np.abs(d).sum()))  # ties (e.g. zeros, equal |d|) count as extreme
    if n <= EXACT_MAX_N:
        count = 0
        chunk = 16  # enumerate the last min(n, 16) signs as a matrix, the rest in a Python loop
        tail = min(n, chunk)
        tail_signs = np.array(list(itertools.product((1.0, -1.0), repeat=tail)))  # (2^tail, tail)
        tail_sums = tail_signs @ d[n - tail :]  # (2^tail,)
        for head in itertools.product((1.0, -1.0), repeat=n - tail):
            head_sum = float(np.dot(head, d[: n - tail])) if head else 0.0
            count += int(np.count_nonzero(np.abs(head_sum + tail_sums) >= observed - tol))
        return count / 2.0**n, True
    rng = np.random.default_rng(seed)
    signs = rng.choice((-1.0, 1.0), size=(MC_PATTERNS, n))
    count = int(np.count_nonzero(np.abs(signs @ d) >= observed - tol)) + 1
    return count / (MC_PATTERNS + 1), False


def paired_delta(values: Sequence[float | None], baseline: Sequence[float | None]) -> PairedDelta | None:
    """Paired differences against `baseline` (same seeds, same order), over the seeds where both are defined;
    None when no seed has both."""
    if len(values) != len(baseline):
        raise ValueError(f"{len(values)} values but {len(baseline)} baseline values: pair them by seed")
    d = [float(v) - float(b) for v, b in zip(values, baseline) if _defined(v) and _defined(b)]
    if not d:
        return None
    n = len(d)
    mean = float(statistics.fmean(d))
    stderr = ci = None
    if n > 1:
        from scipy.stats import t

        stderr = statistics.stdev(d) / math.sqrt(n)
        half = float(t.ppf(0.975, n - 1)) * stderr
        ci = (mean - half, mean + half)
    p, exact = sign_flip_p_value(d)
    return PairedDelta(mean, stderr, ci, p, n, exact)
