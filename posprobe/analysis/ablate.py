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

import numpy as np

from posprobe.glue.stats import paired_delta


def paired_effect(values, baseline) -> dict:
    """{'delta', 'stderr', 'interval' [lo, hi] (None for n < 2), 'p', 'p_exact', 'n'} of per-unit `values` against
    `baseline` (same units, same order), over the units where both are finite."""
    found = paired_delta(
        [float(v) for v in np.asarray(values, dtype=np.float64)],
        [float(b) for b in np.asarray(baseline, dtype=np.float64)],
    )
    if found is None:
        return {"delta": None, "stderr": None, "interval": None, "p": None, "p_exact": None, "n": 0}
    return {
        "delta": found.mean,
        "stderr": found.stderr,
        "interval": None if found.ci95 is None else list(found.ci95),
        "p": found.p_value,
        "p_exact": found.p_exact,
        "n": found.n,
    }


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
