"""Which offsets a TISA fit uses: the fit window, its points against the fit's parameters, the held-out offsets
beyond it, and the one check (with its advice) that refuses a fit with more parameters than points.

Convention: k = j - i. A two-sided fit uses k = -W..W (2W + 1 points); a causal model's fit uses k = -W..0 only
(W + 1 points: the model never uses k > 0). An S-kernel fit has 3·S + 1 parameters (a, b, c per kernel and the
free offset). With as many points as parameters a fit interpolates (R² = 1 whatever the profile), so posprobe
asks for at least twice as many points as parameters: the default window is chosen so, and fits with fewer are
flagged (`few_points`). The held-out offsets are the next `holdout` offsets beyond the window on each side the
model uses; the fitted function's R² there says whether a good in-window R² means something.

Both the estimator (`posprobe.analysis.tisa_fit`) and the fit-tisa pipeline use these rules, so that the advice a
refusal gives is computed for the points the fit really uses, and is accepted when followed. Pure Python/NumPy.
"""

from __future__ import annotations

import math

import numpy as np

from posprobe.errors import ArgumentValueError

#: Default half-width W of a two-sided fit window (k = -W..W, 2W + 1 points). The paper's Fig. 7 zooms in on
#: short distances because that is where the main peaks lie and the largest scores dominate softmax; 16 covers the
#: main peak and the first side lobes of real heads (MiniLM, BERT), keeps 33 points, at least twice the 16
#: parameters of an S = 5 fit, and avoids spending kernels on the slow long-range oscillations of learned position
#: tables that Gaussian bumps cannot represent anyway. A causal fit's default is at least as long and has at least
#: twice as many points as parameters (`default_window`): 31 (k = -31..0, 32 points) for S = 5.
DEFAULT_FIT_WINDOW = 16
#: Offsets held out beyond the window, on each side the model uses.
HOLDOUT_OFFSETS = 8
#: A fit wants at least this many points per parameter; fewer are flagged.
POINTS_PER_PARAMETER = 2


def parameters(n_kernels: int) -> int:
    """Free numbers of an S-kernel fit: a, b, c per kernel and the offset."""
    return 3 * n_kernels + 1


def points(window: int, causal: bool) -> int:
    """Profile points in the fit window: W + 1 for a causal model (k = -W..0), else 2W + 1 (k = -W..W)."""
    return window + 1 if causal else 2 * window + 1


def window_for(n_points: int, causal: bool) -> int:
    """The smallest half-width W whose window holds at least `n_points` points (at least 1)."""
    return max(1, n_points - 1 if causal else math.ceil((n_points - 1) / 2))


def span(window: int, causal: bool) -> str:
    """The fitted offsets in words: 'k = -W..0' or 'k = -W..W'."""
    return f"k = -{window}..0" if causal else f"k = -{window}..{window}"


def few_points(n_points: int, n_kernels: int) -> bool:
    """True when a window of `n_points` points holds fewer than twice as many points as the fit has parameters."""
    return n_points < POINTS_PER_PARAMETER * parameters(n_kernels)


def default_window(kernels: list[int], causal: bool, available: int) -> int:
    """The window used when none is asked for, for fits of every S in `kernels`: two-sided DEFAULT_FIT_WINDOW; causal
    the larger of DEFAULT_FIT_WINDOW and the smallest window with twice as many points as the largest S has
    parameters; both clipped to the `available` offsets (|k| <= available)."""
    if not causal:
        return min(DEFAULT_FIT_WINDOW, available)
    wanted = window_for(POINTS_PER_PARAMETER * parameters(max(kernels)), causal=True)
    return min(max(DEFAULT_FIT_WINDOW, wanted), available)


def check_points(
    kernels: list[int],
    window: int,
    causal: bool,
    available: int,
    asked: bool = True,
    argument: str = "kernels",
    flag: str | None = None,
    have: int | None = None,
) -> None:
    """Refuse an S whose 3·S + 1 parameters exceed the points of the window the fit really uses (such a fit is
    underdetermined for every head and can take minutes). The advice is for those same points, and each piece of
    it is accepted when followed: at most (points - 1) // 3 kernels; a window of at least the smallest one with
    enough points, when the profiles reach that far (else: more positions). `available`: the largest |k| the
    profiles hold on the side(s) fitted; `asked`: the window was given (not the default); `have`: the points really
    in the window when the offsets have gaps (default: every integer k of the window)."""
    have = points(window, causal) if have is None else have
    too_many = [s for s in kernels if parameters(s) > have]
    if not too_many:
        return
    s = max(too_many)
    where = f"the fit window {span(window, causal)}" + (", a causal model's" if causal else "")
    where += "" if asked else " (the default)"
    advice = []
    if (have - 1) // 3 >= 1:
        advice.append(f"use at most {(have - 1) // 3} kernel{'s' if (have - 1) // 3 > 1 else ''}")
    needed = window_for(parameters(s), causal)
    if needed <= available:
        twice = window_for(POINTS_PER_PARAMETER * parameters(s), causal)
        better = f"; {twice} or more gives twice as many points as parameters" if twice <= available else ""
        advice.append(f"a window of at least {needed}{better}")
    else:  # the profiles are too short for any window with enough points
        advice.append(f"profiles over at least {needed + 1} positions (these reach |k| <= {available}) with a window "
                      f"of {needed} or more")  # fmt: skip
    raise ArgumentValueError(
        argument,
        f"{{arg}} {s} needs {parameters(s)} profile points (3·S + 1 parameters) but {where} has {have}",
        ", or ".join(advice),
        flag=flag,
    )


def holdout_offsets(offsets: np.ndarray, window: int, causal: bool, holdout: int = HOLDOUT_OFFSETS) -> np.ndarray:
    """The held-out offsets (sorted, int): the next `holdout` offsets beyond the window on each side the fit uses,
    k = -W-h..-W-1 (and W+1..W+h for a two-sided fit), those among `offsets` only."""
    offsets = np.asarray(offsets)
    left = (offsets < -window) & (offsets >= -window - holdout)
    right = (offsets > window) & (offsets <= window + holdout) & (not causal)
    return offsets[left | right].astype(np.int64)


def holdout_r2(y: np.ndarray, predicted: np.ndarray, window_mean: np.ndarray) -> np.ndarray:
    """Out-of-window R² (M,) of predictions (M, K_h) of held-out profile values y (M, K_h): 1 - RSS / TSS with TSS
    taken around each profile's mean over the fitted window (the constant a fit without kernels would predict), so
    1 = exact, 0 = no better than that constant, < 0 = worse. NaN where undefined: no held-out offsets, or the
    held-out values equal that constant (TSS = 0)."""
    if y.shape[-1] == 0:
        return np.full(y.shape[0], np.nan)
    rss = np.sum((y - predicted) ** 2, axis=-1)
    tss = np.sum((y - window_mean[:, None]) ** 2, axis=-1)
    scale = np.sum(y**2, axis=-1)
    defined = tss > 1e-20 * np.maximum(scale, 1e-300)
    return np.where(defined, 1.0 - rss / np.where(defined, tss, 1.0), np.nan)
