"""The statistics of `posprobe ablate` (issue 46), pure arrays in and out: paired effects of an edit over the same
windows or prompts, the target's effect against random controls, and the head selections.

Conventions (SPEC §12, pairs taken over windows or prompts instead of seeds): for a run with per-unit values v_i and
the baseline's b_i on the same units, the effect is mean(d), d_i = v_i - b_i, with its s.e., a 95 % interval (t with
n - 1 degrees of freedom) and the exact two-sided sign-flip p-value (Monte Carlo past 20 pairs). Against controls
(the same edit on random heads or bands, one per seed): the target's units against the controls' mean on each unit,
d_i = v_i - mean_s c_{s,i}, paired the same way, and the share of controls whose effect is at least as far from zero
as the target's (counting the target: (1 + k) / (1 + N)).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

EXACT_MAX_N = 20  # sign patterns enumerated up to this many pairs; a Monte Carlo estimate past it
MC_PATTERNS = 100_000


def sign_flip_p(d) -> tuple[float, bool]:
    """(two-sided sign-flip p of mean(d) = 0, exact): the share of sign patterns e in {-1, 1}^n with |sum(e d)| >=
    |sum(d)| (ties count as extreme), by enumeration for n <= EXACT_MAX_N, else from MC_PATTERNS random patterns
    (seed 0) plus the observed one."""
    d = np.asarray(d, dtype=np.float64)
    n = len(d)
    observed = abs(float(d.sum()))
    tol = 1e-12 * max(1.0, float(np.abs(d).sum()))
    if n <= EXACT_MAX_N:
        tail = min(n, 16)
        tail_sums = np.array(list(itertools.product((1.0, -1.0), repeat=tail))) @ d[n - tail :]
        count = 0
        for head in itertools.product((1.0, -1.0), repeat=n - tail):
            offset = float(np.dot(head, d[: n - tail])) if head else 0.0
            count += int(np.count_nonzero(np.abs(offset + tail_sums) >= observed - tol))
        return count / 2.0**n, True
    signs = np.random.default_rng(0).choice((-1.0, 1.0), size=(MC_PATTERNS, n))
    return (int(np.count_nonzero(np.abs(signs @ d) >= observed - tol)) + 1) / (MC_PATTERNS + 1), False


def paired_effect(values, baseline) -> dict:
    """{'delta', 'stderr', 'interval' [lo, hi] (None for n < 2), 'p', 'p_exact', 'n'} of per-unit `values` against
    `baseline` (same units, same order), over the units where both are finite."""
    values, baseline = np.asarray(values, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    both = np.isfinite(values) & np.isfinite(baseline)
    d = values[both] - baseline[both]
    n = len(d)
    if n == 0:
        return {"delta": None, "stderr": None, "interval": None, "p": None, "p_exact": None, "n": 0}
    mean, stderr, interval = float(d.mean()), None, None
    if n > 1:
        from scipy.stats import t

        stderr = float(d.std(ddof=1)) / math.sqrt(n)
        half = float(t.ppf(0.975, n - 1)) * stderr
        interval = [mean - half, mean + half]
    p, exact = sign_flip_p(d)
    return {"delta": mean, "stderr": stderr, "interval": interval, "p": p, "p_exact": exact, "n": n}


def against_controls(target, controls, baseline) -> dict:
    """The target's per-unit values `target` (n,) against `controls` (N, n), all with `baseline` (n,): the target's
    delta, the controls' deltas (their mean, s.d., min and max), the share of controls at least as extreme, and the
    paired effect of the target against the controls' mean on each unit."""
    target, baseline = np.asarray(target, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    controls = np.asarray(controls, dtype=np.float64).reshape(-1, len(target))
    delta = float(np.mean(target - baseline))
    deltas = (controls - baseline[None]).mean(1)
    extreme = int(np.sum(np.abs(deltas) >= abs(delta) - 1e-12 * max(1.0, abs(delta))))
    return {
        "target_delta": delta,
        "control_deltas": [float(x) for x in deltas],
        "control_mean": float(deltas.mean()) if len(deltas) else None,
        "control_sd": float(deltas.std(ddof=1)) if len(deltas) > 1 else None,
        "control_range": [float(deltas.min()), float(deltas.max())] if len(deltas) else None,
        "share_as_extreme": (1 + extreme) / (1 + len(deltas)),
        "paired": paired_effect(target, controls.mean(0)) if len(deltas) else None,
    }


def top_heads(scores, k: int, exclude=()) -> list[tuple[int, int]]:
    """The `k` heads (layer, head) with the largest `scores` (L, H), NaN left out, ties in (layer, head) order."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-np.nan_to_num(scores, nan=-np.inf), axis=None, kind="stable")
    picked = []
    for flat in order:
        layer, head = (int(x) for x in np.unravel_index(flat, scores.shape))
        if np.isfinite(scores[layer, head]) and (layer, head) not in set(exclude):
            picked.append((layer, head))
        if len(picked) == k:
            break
    return picked


def random_heads(n_layers: int, n_heads: int, k: int, exclude, seed: int) -> list[tuple[int, int]]:
    """`k` heads drawn without replacement from the (layer, head) grid less `exclude`, by `seed`, in grid order."""
    excluded = {tuple(h) for h in exclude}
    pool = [(layer, head) for layer in range(n_layers) for head in range(n_heads) if (layer, head) not in excluded]
    picks = np.random.default_rng(seed).choice(len(pool), size=min(k, len(pool)), replace=False)
    return sorted(pool[i] for i in picks)


def random_bands(pairs: int, k: int, exclude, seed: int) -> list[int]:
    """`k` rotary pairs drawn without replacement from 0..pairs-1 less `exclude`, by `seed`, sorted."""
    pool = [f for f in range(pairs) if f not in set(exclude)]
    picks = np.random.default_rng(seed).choice(len(pool), size=min(k, len(pool)), replace=False)
    return sorted(pool[i] for i in picks)
