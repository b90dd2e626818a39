"""Fit TISA positional scoring functions to attention-head profiles (SPEC §4, seed paper appendix C).

Convention: the relative offset is ``k = j - i`` (query/row ``i``, key/column ``j``); profiles are
stored over ``k`` increasing. One head's scoring function is

    f(k) = sum_{s=1..S} a_s * exp(-|b_s| * (k - c_s)^2)

and a kernel with ``c_s > 0`` attends to the right (later tokens). Softmax ignores a constant added
to a row, so every head is fitted with a free ``offset`` that is reported separately and is *not*
part of the kernels: ``profile(k) ~ f(k) + offset``.

Method: variable projection. Given the nonlinear parameters (``log b``, ``c``) the amplitudes ``a``
and the offset are the solution of a small linear least-squares problem, so only ``2S`` numbers per
head are optimised, by a Levenberg-Marquardt iteration with Kaufman's Jacobian. All heads and all
restarts are one batch of NumPy arrays (no Python loop over heads). Per head:

1. starts, in this order: a forward stagewise fit (one kernel at a time on the largest residual,
   re-optimised after each addition), orthogonal matching pursuit over a dictionary of kernels
   (all widths, narrow only, wide only), greedy peak picking, an even grid, then seeded random
   draws (the same draws for every head, so a head's fit never depends on the other heads);
2. LM from every start (every 15 iterations, restarts more than 10% behind their head's best are
   dropped: racing; racing sooner costs quality on noisy profiles, see benchmarks/RESULTS.md);
3. basin hopping: rounds of restarts from perturbations of the best solution (weakest kernel moved
   onto the largest residual or split off the strongest kernel, small jitters, one kernel
   re-seeded anywhere);
4. a short unregularised polish that removes the small bias of the ridge (see RIDGE).

Default effort: 8 starts, 2 hop rounds of 32 candidates, at most 200 LM iterations per run, racing.
``exhaustive=True`` runs the same machinery with at least as much effort in every respect (64
starts, 4 hop rounds, 2000 iterations, no racing): a reference for checking that the default does
not leave fit quality on the table (benchmarks/bench_fit_tisa.py).

This module is the estimator (its parameters, checks, window and the R^2 it reports); the numerical core is
`posprobe.analysis.tisa_numerics`. Pure NumPy: no torch, typer, rich or matplotlib here.
"""

from __future__ import annotations

import numpy as np

from posprobe.analysis.tisa_numerics import (
    B_MAX,
    B_MIN_SCALE,
    C_MAX_SCALE,
    DEFAULT_HOP_ROUNDS,
    DEFAULT_HOPS,
    DEFAULT_MAX_ITER,
    DEFAULT_RESTARTS,
    EXHAUSTIVE_HOP_ROUNDS,
    EXHAUSTIVE_HOPS,
    EXHAUSTIVE_MAX_ITER,
    EXHAUSTIVE_RESTARTS,
    fit_standardised,
)
from posprobe.analysis.tisa_window import (
    DEFAULT_FIT_WINDOW,
    HOLDOUT_OFFSETS,
    check_points,
    default_window,
    few_points,
    holdout_offsets,
    holdout_r2,
)
from posprobe.errors import ArgumentError, ArgumentValueError, PosprobeError
from posprobe.validation import as_bool, as_int

#: A fit below this R^2 is flagged as poor.
POOR_R2 = 0.5


def tisa_function(k, a, b, c) -> np.ndarray:
    """Evaluate f(k) = sum_s a_s exp(-|b_s| (k - c_s)^2).

    `k`: scalar or array of offsets (any shape, k = j - i); `a`, `b`, `c`: arrays of shape (..., S).
    Returns shape ``a.shape[:-1] + k.shape``.
    """
    k = np.asarray(k, dtype=np.float64)
    a, b, c = (np.asarray(x, dtype=np.float64) for x in (a, b, c))
    a, b, c = np.broadcast_arrays(a, b, c)
    flat = k.reshape(-1)
    diff = flat[:, None] - c[..., None, :]  # (..., K, S)
    values = np.sum(a[..., None, :] * np.exp(-np.abs(b)[..., None, :] * diff**2), axis=-1)
    return values.reshape(a.shape[:-1] + k.shape)


class TisaKernelFitter:
    """Least-squares TISA kernels for many heads at once, following scikit-learn's estimator contract.

    ``__init__`` only stores the parameters (checked in `fit`); `get_params` / `set_params`; `fit` returns
    the fitter; learned attributes end in ``_``; `predict` and `score` as for a regressor.

    Parameters
    ----------
    n_kernels: S, kernels per head (>= 1).
    window: half-width W of the fit window (k = -W..W, or -W..0 for a causal model's profiles); None = the default
        of `tisa_window.default_window` (16; causal: at least twice as many points as parameters), clipped to the
        available offsets.
    restarts: starts per head (the deterministic starts first, then seeded random ones);
        default 8 (exhaustive: 64).
    max_iter: Levenberg-Marquardt iterations per run; default 200 (exhaustive: 2000).
    seed: seed of the random starts; the fit is deterministic for a given seed.
    exhaustive: many restarts and long runs (a reference for checking the default).

    A causal model's profiles (offsets k <= 0 only, or a `ProfileResult` with `causal`) are fitted over
    k = -W..0: the model never uses k > 0. The default window (`posprobe.analysis.tisa_window.default_window`) is
    16, and for a causal fit at least long enough for twice as many points as the 3·S + 1 parameters; a window
    with fewer points than parameters is refused, with fewer than twice as many flagged (`few_points_`).

    `fit(profiles, offsets)` takes profiles of shape (..., K) -- one head (K,), heads (M, K), or layers x heads
    (L, H, K) as in `posprobe.profiles(...).profiles` -- over integer offsets k = j - i (K,); offsets may be
    omitted for a centred odd K (k = -(K-1)/2 .. (K-1)/2), and a `ProfileResult` may be passed alone.
    After `fit`, with ``...`` the leading shape of the profiles (M for a 2-D input): ``a_``, ``b_`` (>= 0),
    ``c_`` of shape (..., S), kernels sorted by centre; ``offset_`` (...); ``r2_`` (...), the fraction of the
    profile's variance over the window explained by f + offset; ``holdout_r2_`` (...) the R² of f + offset on the
    held-out offsets ``holdout_offsets_`` (the next HOLDOUT_OFFSETS = 8 beyond the window on each side fitted,
    where the profiles reach) against the window's mean (NaN where undefined, see
    `tisa_window.holdout_r2`); ``flags_`` list of str per head ('' when fine; nested ``[L][H]`` for a 3-D input);
    ``window_`` (the W used), ``fit_offsets_`` (the k values fitted), ``causal_``, ``n_points_`` and
    ``few_points_`` (fewer than twice as many points as parameters).
    """

    _PARAMS = ("n_kernels", "window", "restarts", "max_iter", "seed", "exhaustive")
    _DEFAULTS = dict(n_kernels=5, window=None, restarts=None, max_iter=None, seed=0, exhaustive=False)

    def __init__(
        self,
        n_kernels: int = 5,
        window: int | None = None,
        restarts: int | None = None,
        max_iter: int | None = None,
        seed: int = 0,
        exhaustive: bool = False,
    ):
        self.n_kernels = n_kernels
        self.window = window
        self.restarts = restarts
        self.max_iter = max_iter
        self.seed = seed
        self.exhaustive = exhaustive

    # ------------------------------------------------------------------ estimator contract

    def get_params(self, deep: bool = True) -> dict:
        """The constructor parameters as a dict (`deep` is accepted for scikit-learn compatibility)."""
        return {name: getattr(self, name) for name in self._PARAMS}

    def set_params(self, **params) -> TisaKernelFitter:
        """Set constructor parameters by name; returns the fitter. Unknown names raise a ValueError."""
        for name, value in params.items():
            if name not in self._PARAMS:
                raise ArgumentValueError(
                    name, f"TisaKernelFitter has no parameter '{name}'", f"valid: {', '.join(self._PARAMS)}"
                )
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        changed = [f"{n}={getattr(self, n)!r}" for n in self._PARAMS if getattr(self, n) != self._DEFAULTS[n]]
        return f"TisaKernelFitter({', '.join(changed)})"

    # ------------------------------------------------------------------ public

    def fit(self, profiles, offsets=None) -> TisaKernelFitter:
        """Fit every profile of `profiles` (..., K) given over integer `offsets` (K,), k = j - i."""
        n_kernels = _param(self.n_kernels, "n_kernels", "--kernels", "e.g. 5 (the TISA paper's S)")
        seed = _param(self.seed, "seed", "--seed", "any whole number >= 0")
        exhaustive = as_bool(self.exhaustive, "exhaustive")
        y_all, k_all, lead = _check_profiles(profiles, offsets)
        causal = bool(k_all.max() <= 0)  # one-sided profiles: a causal model's k <= 0
        window = self._resolve_window(k_all, n_kernels, causal)
        restarts, max_iter = self._resolve_effort(exhaustive)
        hops = EXHAUSTIVE_HOPS if exhaustive else DEFAULT_HOPS
        hop_rounds = EXHAUSTIVE_HOP_ROUNDS if exhaustive else DEFAULT_HOP_ROUNDS
        race = not exhaustive

        keep = np.abs(k_all) <= window
        kw = k_all[keep].astype(np.float64)
        available = int(-k_all.min() if causal else min(-k_all.min(), k_all.max()))
        check_points([n_kernels], window, causal, available, self.window is not None, "n_kernels", "--kernels", kw.size)
        y = y_all[:, keep]
        m = y.shape[0]

        mean = y.mean(axis=1)
        centred = y - mean[:, None]
        std = np.sqrt(np.mean(centred**2, axis=1))
        spread = np.ptp(y, axis=1)
        scale = np.max(np.abs(y), axis=1)
        flat = (spread == 0) | (spread <= 1e-10 * scale)

        a = np.zeros((m, n_kernels))
        b = np.zeros((m, n_kernels))
        c = np.zeros((m, n_kernels))
        offset = mean.copy()
        r2 = np.ones(m)
        live = np.flatnonzero(~flat)
        if live.size:
            z = centred[live] / std[live, None]
            logb_min = np.log(B_MIN_SCALE / window**2)
            bounds = (logb_min, np.log(B_MAX), C_MAX_SCALE * window)
            effort = (n_kernels, restarts, max_iter, hops, hop_rounds, race, bounds, seed)
            logb, cc, coef = fit_standardised(z, kw, effort)
            order = np.argsort(cc, axis=1, kind="stable")
            take = lambda arr: np.take_along_axis(arr, order, axis=1)  # noqa: E731
            a[live] = take(coef[:, :n_kernels]) * std[live, None]
            b[live] = take(np.exp(logb))
            c[live] = take(cc)
            offset[live] = coef[:, n_kernels] * std[live] + mean[live]
            fitted = tisa_function(kw, a[live], b[live], c[live]) + offset[live, None]
            rss_orig = np.sum((y[live] - fitted) ** 2, axis=1)
            tss = np.sum(centred[live] ** 2, axis=1)
            r2[live] = np.clip(1.0 - rss_orig / tss, 0.0, 1.0)

        flags = []
        for h in range(m):
            notes = []
            if flat[h]:
                notes.append("flat profile (no positional dependence; a = 0, R^2 = 1)")
            elif r2[h] < POOR_R2:
                notes.append(f"poor fit (R^2 = {r2[h]:.2f})")
            flags.append("; ".join(notes))

        held_out = holdout_offsets(k_all, window, causal, HOLDOUT_OFFSETS)
        at = np.isin(k_all, held_out)
        predicted = tisa_function(held_out, a, b, c) + offset[:, None]
        r2_out = holdout_r2(y_all[:, at], predicted, mean)

        outputs = (a, b, c, offset, r2)
        if not all(np.all(np.isfinite(x)) for x in outputs):  # pragma: no cover - defensive
            raise PosprobeError(
                "the TISA fit produced non-finite values", "report this with the profile file that caused it"
            )
        self.a_, self.b_, self.c_ = (x.reshape(lead + (n_kernels,)) for x in (a, b, c))
        self.offset_, self.r2_ = offset.reshape(lead), r2.reshape(lead)
        self.flags_ = np.array(flags, dtype=object).reshape(lead).tolist() if len(lead) > 1 else flags
        self.holdout_r2_ = r2_out.reshape(lead)
        self.holdout_offsets_ = held_out
        self.window_ = window
        self.fit_offsets_ = k_all[keep].copy()
        self.causal_ = causal
        self.n_points_ = int(kw.size)
        self.few_points_ = few_points(kw.size, n_kernels)
        return self

    def predict(self, offsets, include_offset: bool = True) -> np.ndarray:
        """Fitted f(k) (+ offset) of every head at `offsets` (K,): shape (..., K), ... as the fitted profiles."""
        self._check_fitted()
        values = tisa_function(np.asarray(offsets), self.a_, self.b_, self.c_)
        return values + self.offset_[..., None] if include_offset else values

    def score(self, profiles, offsets=None) -> float:
        """Mean over heads of R^2 of the fitted f + offset against `profiles` (..., K), within the fitted window
        |k| <= window_ (the same R^2 as ``r2_`` when scoring the fitted profiles, without its clipping at 0).
        A profile that is flat over the window scores 1 if it is predicted exactly, else 0."""
        self._check_fitted()
        y, k, lead = _check_profiles(profiles, offsets)
        if lead != self.offset_.shape:
            raise ArgumentValueError(
                "profiles",
                f"profiles have {lead or 'one'} heads but the fitter was fitted on {self.offset_.shape}",
                "score profiles of the same heads, in the same shape",
            )
        keep = np.abs(k) <= self.window_
        pred = self.predict(k[keep]).reshape(y.shape[0], -1)
        y = y[:, keep]
        rss = np.sum((y - pred) ** 2, axis=1)
        tss = np.sum((y - y.mean(axis=1, keepdims=True)) ** 2, axis=1)
        r2 = np.where(tss > 0, 1.0 - rss / np.where(tss > 0, tss, 1.0), np.where(rss <= 1e-20, 1.0, 0.0))
        return float(np.mean(r2))

    # ----------------------------------------------------------------- checks

    def _check_fitted(self) -> None:
        if not hasattr(self, "a_"):
            raise PosprobeError("this TisaKernelFitter has not been fitted", "call fit(profiles, offsets) first")

    def _resolve_window(self, k_all: np.ndarray, n_kernels: int, causal: bool) -> int:
        """The half-width W fitted; refuses a window with fewer points than the fit has parameters."""
        # two-sided profiles: |k| <= what both sides cover; one-sided k <= 0 (a causal model's): k >= -W
        available = int(-k_all.min() if causal else min(-k_all.min(), k_all.max()))
        if available < 1:
            raise ArgumentValueError(
                "offsets",
                "the profiles do not cover offsets k = -1..1 (or -1..0 for a causal model)",
                "pass profiles over k = -(n-1)..n-1 (a causal model's: -(n-1)..0) with n >= 2",
            )
        if self.window is None:
            w = default_window([n_kernels], causal, available)
        else:
            span = "-window..0" if causal else "-window..window"
            hint = f"a window between 1 and {available} (the fit uses k = {span})"
            w = _param(self.window, "window", "--window", hint)
            if w > available:
                raise ArgumentValueError(
                    "window", f"the fit window {w} is larger than the available offsets (|k| <= {available})", hint
                )
        return w

    def _resolve_effort(self, exhaustive: bool) -> tuple[int, int]:
        restarts = self.restarts
        max_iter = self.max_iter
        if restarts is None:
            restarts = EXHAUSTIVE_RESTARTS if exhaustive else DEFAULT_RESTARTS
        if max_iter is None:
            max_iter = EXHAUSTIVE_MAX_ITER if exhaustive else DEFAULT_MAX_ITER
        restarts = _param(restarts, "restarts", "--restarts", "a positive number of starts per head")
        max_iter = _param(max_iter, "max_iter", "--max-iter", "a positive number of iterations")
        return restarts, max_iter


def _param(value, name: str, flag: str, hint: str) -> int:
    """A whole-number parameter >= 1 (seed: >= 0), its error worded for the library (`name`) or the CLI (`flag`)."""
    try:
        return as_int(value, name, minimum=0 if name == "seed" else 1, hint=hint)
    except ArgumentError as err:
        err.flag = flag
        raise


def _check_profiles(profiles, offsets) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Validate; return profiles as float64 (M, K), offsets as int64 (K,) and the leading shape of the input.

    `profiles` (..., K) or an object with `.profiles` and `.offsets` (a ProfileResult); `offsets` None means
    centred offsets -(K-1)/2 .. (K-1)/2 (K odd)."""
    if offsets is None and hasattr(profiles, "profiles") and hasattr(profiles, "offsets"):
        causal = bool(getattr(profiles, "causal", False))
        profiles, offsets = profiles.profiles, profiles.offsets
        if causal:  # a causal model never uses k > 0: fit its profiles over k <= 0 only
            keep = np.asarray(offsets) <= 0
            profiles, offsets = np.asarray(profiles)[..., keep], np.asarray(offsets)[keep]
    try:
        y = np.asarray(profiles, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ArgumentValueError(
            "profiles", f"{{arg}} must be a numeric array ({err})", "pass profiles of shape (heads, K) or (L, H, K)"
        ) from err
    if y.ndim == 0 or y.shape[-1] == 0 or y.size == 0:
        raise ArgumentValueError("profiles", f"{{arg}} of shape {y.shape} hold no profile", "pass shape (..., K)")
    if offsets is None:
        if y.shape[-1] % 2 != 1:
            raise ArgumentValueError(
                "offsets",
                f"{{arg}} are needed: profiles of even length {y.shape[-1]} are not centred on k = 0",
                "pass the integer offsets k = j - i of the last axis",
            )
        half = y.shape[-1] // 2
        offsets = np.arange(-half, half + 1)
    try:
        k = np.asarray(offsets, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ArgumentValueError("offsets", f"{{arg}} must be numeric ({err})", "pass K integer offsets") from err
    lead = y.shape[:-1]
    y = y.reshape(-1, y.shape[-1])
    if k.ndim != 1 or y.shape[1] != k.shape[0]:
        raise ArgumentValueError(
            "profiles",
            f"profiles with last axis {y.shape[-1]} do not match offsets of shape {k.shape}",
            "pass profiles of shape (heads, K) and K offsets k = j - i",
        )
    if not np.all(np.isfinite(k)) or np.any(k != np.round(k)) or np.any(np.diff(k) <= 0):
        raise ArgumentValueError(
            "offsets",
            "offsets must be distinct integers in increasing order",
            "pass k = -(n-1)..n-1 as stored in a posprobe profile file",
        )
    bad = ~np.isfinite(y)
    if bad.any():
        rows = np.unique(np.nonzero(bad)[0])
        raise ArgumentValueError(
            "profiles",
            f"{int(bad.sum())} NaN/inf values in the profiles (rows {rows[:5].tolist()}"
            f"{'...' if rows.size > 5 else ''})",
            "recompute the profiles; check the checkpoint weights for NaN/inf",
        )
    return y, k.astype(np.int64), tuple(lead)


__all__ = ["DEFAULT_FIT_WINDOW", "POOR_R2", "TisaKernelFitter", "tisa_function"]
