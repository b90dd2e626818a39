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

Pure NumPy: no torch, typer, rich or matplotlib here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posprobe.errors import ArgumentError, ArgumentValueError, PosprobeError
from posprobe.validation import as_bool, as_int

#: Default half-width W of the fit window: the fit uses k = -W..W (2W+1 points). The paper's Fig. 7
#: zooms in on short distances because that is where the main peaks lie and the largest scores
#: dominate softmax; 16 covers the main peak and the first side lobes of real heads (MiniLM, BERT),
#: keeps 33 points for the 16 free numbers of an S=5 fit, and avoids spending kernels on the slow
#: long-range oscillations of learned position tables that Gaussian bumps cannot represent anyway.
DEFAULT_FIT_WINDOW = 16
#: Kernel width bounds: b = |b_s| lies in [B_MIN_SCALE / W^2, B_MAX]. At b = B_MAX a kernel is a
#: single-offset spike (exp(-10) ~ 5e-5 one step away); at the lower bound it still curves by ~10%
#: across the window (a flatter bump is indistinguishable from the offset and would let `a` blow up).
B_MIN_SCALE = 0.1
B_MAX = 10.0
#: Centres stay within C_MAX_SCALE * W: inside the fitted window, so that no kernel is placed where
#: there was no data (such kernels would shape f(k) beyond the window, where TISA extrapolates).
C_MAX_SCALE = 1.0
#: Ridge on the standardised amplitudes: keeps near-duplicate kernels from cancelling with huge |a|.
RIDGE = 1e-4
#: Ridge of the final polish (numerical safety only); see `_polish`.
POLISH_RIDGE = 1e-10
#: A fit below this R^2 is flagged as poor.
POOR_R2 = 0.5

_DEFAULT_RESTARTS = 8
_DEFAULT_MAX_ITER = 200
_EXHAUSTIVE_RESTARTS = 64
_EXHAUSTIVE_MAX_ITER = 2000
_GAIN_TOL = 1e-9
_STALL = 6
_MAX_REJECT = 10
_RACE_EVERY = 15
_RACE_MARGIN = 1.1
_DEFAULT_HOPS = 32
_EXHAUSTIVE_HOPS = 32
_DEFAULT_HOP_ROUNDS = 2
_EXHAUSTIVE_HOP_ROUNDS = 4


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


@dataclass
class _Batch:
    """Nonlinear parameters of N problems: log-widths and centres, each (N, S)."""

    logb: np.ndarray
    c: np.ndarray


class TisaKernelFitter:
    """Least-squares TISA kernels for many heads at once, following scikit-learn's estimator contract.

    ``__init__`` only stores the parameters (checked in `fit`); `get_params` / `set_params`; `fit` returns
    the fitter; learned attributes end in ``_``; `predict` and `score` as for a regressor.

    Parameters
    ----------
    n_kernels: S, kernels per head (>= 1).
    window: half-width W of the fit window (k = -W..W); None = min(DEFAULT_FIT_WINDOW, available).
    restarts: starts per head (the deterministic starts first, then seeded random ones);
        default 8 (exhaustive: 64).
    max_iter: Levenberg-Marquardt iterations per run; default 200 (exhaustive: 2000).
    seed: seed of the random starts; the fit is deterministic for a given seed.
    exhaustive: many restarts and long runs (a reference for checking the default).

    `fit(profiles, offsets)` takes profiles of shape (..., K) -- one head (K,), heads (M, K), or layers x heads
    (L, H, K) as in `posprobe.profiles(...).profiles` -- over integer offsets k = j - i (K,); offsets may be
    omitted for a centred odd K (k = -(K-1)/2 .. (K-1)/2), and a `ProfileResult` may be passed alone.
    After `fit`, with ``...`` the leading shape of the profiles (M for a 2-D input): ``a_``, ``b_`` (>= 0),
    ``c_`` of shape (..., S), kernels sorted by centre; ``offset_`` (...); ``r2_`` (...), the fraction of the
    profile's variance over the window explained by f + offset; ``flags_`` list of str per head ('' when
    fine; nested [L][H] for a 3-D input); ``window_`` (the W used) and ``fit_offsets_`` (the k values fitted).
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
        window = self._resolve_window(k_all)
        restarts, max_iter = self._resolve_effort(exhaustive)
        hops = _EXHAUSTIVE_HOPS if exhaustive else _DEFAULT_HOPS
        hop_rounds = _EXHAUSTIVE_HOP_ROUNDS if exhaustive else _DEFAULT_HOP_ROUNDS
        race = not exhaustive

        keep = np.abs(k_all) <= window
        kw = k_all[keep].astype(np.float64)
        if kw.size < 3 * n_kernels + 1:  # more parameters (a, b, c per kernel and the offset) than points
            raise ArgumentValueError(
                "n_kernels",
                f"{{arg}} {n_kernels} needs {3 * n_kernels + 1} profile points (3·S + 1 parameters) but the window "
                f"holds {kw.size}",
                f"use at most {(kw.size - 1) // 3} kernels, or a wider window",
                flag="--kernels",
            )
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
            logb, cc, coef = _fit_standardised(z, kw, effort)
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

        outputs = (a, b, c, offset, r2)
        if not all(np.all(np.isfinite(x)) for x in outputs):  # pragma: no cover - defensive
            raise PosprobeError(
                "the TISA fit produced non-finite values", "report this with the profile file that caused it"
            )
        self.a_, self.b_, self.c_ = (x.reshape(lead + (n_kernels,)) for x in (a, b, c))
        self.offset_, self.r2_ = offset.reshape(lead), r2.reshape(lead)
        self.flags_ = np.array(flags, dtype=object).reshape(lead).tolist() if len(lead) > 1 else flags
        self.window_ = window
        self.fit_offsets_ = k_all[keep].copy()
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

    def _resolve_window(self, k_all: np.ndarray) -> int:
        # two-sided profiles: |k| <= what both sides cover; one-sided k <= 0 (a causal model's): k >= -W
        available = int(-k_all.min() if k_all.max() <= 0 else min(-k_all.min(), k_all.max()))
        if available < 1:
            raise ArgumentValueError(
                "offsets",
                "the profiles do not cover offsets k = -1..1 (or -1..0 for a causal model)",
                "pass profiles over k = -(n-1)..n-1 (a causal model's: -(n-1)..0) with n >= 2",
            )
        if self.window is None:
            return min(DEFAULT_FIT_WINDOW, available)
        hint = f"a window between 1 and {available} (the fit uses k = -window..window)"
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
            restarts = _EXHAUSTIVE_RESTARTS if exhaustive else _DEFAULT_RESTARTS
        if max_iter is None:
            max_iter = _EXHAUSTIVE_MAX_ITER if exhaustive else _DEFAULT_MAX_ITER
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


def _fit_standardised(z: np.ndarray, kw: np.ndarray, effort: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Starts, Levenberg-Marquardt, basin hopping and polish for standardised profiles z (M, K).

    Returns log-widths, centres (M, S) and coefficients (M, S+1). Every random draw is shared by all heads
    (one generator from `seed`), so a head's result does not depend on the other rows of `z`.
    """
    n_kernels, restarts, max_iter, hops, hop_rounds, race, bounds, seed = effort
    rng = np.random.default_rng(seed)
    n_live = z.shape[0]
    starts = _starts(z, kw, n_kernels, restarts, bounds, rng)
    z_rep = np.repeat(z, restarts, axis=0)  # problem p = head * restarts + r
    group = np.repeat(np.arange(n_live), restarts) if race else None
    batch = _levenberg_marquardt(z_rep, kw, starts, bounds, max_iter, group=group)
    coef, rss = _linear_solve(z_rep, kw, batch)
    best = np.argmin(rss.reshape(n_live, restarts), axis=1) + np.arange(n_live) * restarts
    logb, cc, coef, rss = batch.logb[best], batch.c[best], coef[best], rss[best]
    for _ in range(hop_rounds):
        logb, cc, coef, rss = _hop(z, kw, _Batch(logb, cc), coef, rss, hops, bounds, max_iter, rng, race)
    return _polish(z, kw, _Batch(logb, cc), coef, rss, bounds)


def _check_profiles(profiles, offsets) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Validate; return profiles as float64 (M, K), offsets as int64 (K,) and the leading shape of the input.

    `profiles` (..., K) or an object with `.profiles` and `.offsets` (a ProfileResult); `offsets` None means
    centred offsets -(K-1)/2 .. (K-1)/2 (K odd)."""
    if offsets is None and hasattr(profiles, "profiles") and hasattr(profiles, "offsets"):
        profiles, offsets = profiles.profiles, profiles.offsets
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


# ------------------------------------------------------------------ numerics
#
# Everything below works on standardised profiles z (zero mean, unit RMS over the window) and on a
# batch of N problems; the model is z ~ G(logb, c) @ a + offset, with G[k, s] = exp(-b_s (k - c_s)^2).


def _design(kw: np.ndarray, batch: _Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """G (N, K, S), k - c (N, K, S) and b (N, S)."""
    b = np.exp(batch.logb)
    diff = kw[None, :, None] - batch.c[:, None, :]
    return np.exp(-b[:, None, :] * diff**2), diff, b


def _gram(g: np.ndarray, ridge_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Phi = [G, 1] (N, K, S+1) and its ridge-regularised Gram matrix (N, S+1, S+1)."""
    n, k, s = g.shape
    phi = np.concatenate([g, np.ones((n, k, 1))], axis=2)
    phi_t = phi.transpose(0, 2, 1)
    gram = phi_t @ phi
    ridge = np.full(s + 1, ridge_scale * k)
    ridge[-1] = 1e-12 * k  # the offset is (almost) free
    gram[:, np.arange(s + 1), np.arange(s + 1)] += ridge
    return phi, gram


def _normal_solve(g: np.ndarray, z: np.ndarray, ridge_scale: float = RIDGE) -> tuple[np.ndarray, np.ndarray]:
    """Ridge-regularised linear fit of z (N, K) on [G, 1]: coefficients (N, S+1) and Phi."""
    phi, gram = _gram(g, ridge_scale)
    coef = np.linalg.solve(gram, phi.transpose(0, 2, 1) @ z[:, :, None])[:, :, 0]
    return coef, phi


def _cost(z: np.ndarray, phi: np.ndarray, coef: np.ndarray, ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """Residual (N, K) and penalised cost RSS + ridge * K * |a|^2 (N,)."""
    s = coef.shape[1] - 1
    resid = z - (phi @ coef[:, :, None])[:, :, 0]
    return resid, np.sum(resid**2, axis=1) + ridge * z.shape[1] * np.sum(coef[:, :s] ** 2, axis=1)


def _linear_solve(z: np.ndarray, kw: np.ndarray, batch: _Batch, ridge: float = RIDGE) -> tuple[np.ndarray, np.ndarray]:
    """Best amplitudes + offset (N, S+1) and residual sum of squares (N,) for fixed widths/centres."""
    g, _, _ = _design(kw, batch)
    coef, phi = _normal_solve(g, z, ridge)
    resid = z - (phi @ coef[:, :, None])[:, :, 0]
    return coef, np.sum(resid**2, axis=1)


def _evaluate(z, kw, batch, ridge: float = RIDGE):
    """Cost RSS + ridge*K*|a|^2 (N,), residual (N, K), and the pieces `_jacobian` needs."""
    g, diff, b = _design(kw, batch)
    phi, gram = _gram(g, ridge)
    coef = np.linalg.solve(gram, phi.transpose(0, 2, 1) @ z[:, :, None])[:, :, 0]
    resid, cost = _cost(z, phi, coef, ridge)
    return cost, resid, (g, diff, b, phi, gram, coef)


def _jacobian(parts) -> np.ndarray:
    """Kaufman's variable-projection Jacobian (N, K, 2S) over (log b_1..S, c_1..S): the model's
    derivatives with the span of [G, 1] projected out."""
    g, diff, b, phi, gram, coef = parts
    s = g.shape[2]
    ag = coef[:, None, :s] * g * b[:, None, :]  # a_s b_s G_s, (N, K, S)
    deriv = np.concatenate([-ag * diff**2, 2.0 * ag * diff], axis=2)  # d model / d(log b_s), d(c_s)
    return deriv - phi @ np.linalg.solve(gram, phi.transpose(0, 2, 1) @ deriv)


def _clip(batch: _Batch, bounds) -> _Batch:
    logb_min, logb_max, c_max = bounds
    return _Batch(np.clip(batch.logb, logb_min, logb_max), np.clip(batch.c, -c_max, c_max))


def _levenberg_marquardt(
    z: np.ndarray,
    kw: np.ndarray,
    start: _Batch,
    bounds,
    max_iter: int,
    ridge: float = RIDGE,
    group: np.ndarray | None = None,
) -> _Batch:
    """Minimise the projected residual of every problem; converged problems drop out of the batch.

    `group` (N,) names the head of each problem (restarts of one head share it): every _RACE_EVERY
    iterations, restarts whose cost is far above their head's best so far stop early (racing)."""
    batch = _clip(start, bounds)
    n, s = batch.c.shape
    lam = np.full(n, 1e-2)
    active = np.arange(n)
    cost, resid, parts = _evaluate(z, kw, batch, ridge)
    jac = _jacobian(parts)
    stall = np.zeros(n, dtype=int)
    rejected = np.zeros(n, dtype=int)
    eye = np.eye(2 * s)
    for it in range(max_iter):
        if group is not None and it and it % _RACE_EVERY == 0 and active.size:
            head_best = np.full(group.max() + 1, np.inf)
            np.minimum.at(head_best, group, cost)
            active = active[cost[active] <= _RACE_MARGIN * head_best[group[active]] + 1e-12]
        if active.size == 0:
            break
        j = jac[active]
        jt = j.transpose(0, 2, 1)
        jtj = jt @ j
        grad = (jt @ resid[active][:, :, None])[:, :, 0]
        diag = np.diagonal(jtj, axis1=1, axis2=2)
        damp = lam[active, None] * (diag + 1e-9 * (1.0 + diag.max(axis=1, keepdims=True)))
        step = np.linalg.solve(jtj + damp[:, :, None] * eye, grad[:, :, None])[:, :, 0]
        trial = _clip(_Batch(batch.logb[active] + step[:, :s], batch.c[active] + step[:, s:]), bounds)
        t_cost, t_resid, t_parts = _evaluate(z[active], kw, trial, ridge)
        better = t_cost < cost[active]
        gain = np.where(better, (cost[active] - t_cost) / np.maximum(cost[active], 1e-300), 0.0)
        idx_ok = active[better]
        if idx_ok.size:
            batch.logb[idx_ok] = trial.logb[better]
            batch.c[idx_ok] = trial.c[better]
            cost[idx_ok] = t_cost[better]
            resid[idx_ok] = t_resid[better]
            jac[idx_ok] = _jacobian(tuple(x[better] for x in t_parts))
        lam[idx_ok] = np.maximum(lam[idx_ok] / 3.0, 1e-9)
        idx_bad = active[~better]
        lam[idx_bad] = lam[idx_bad] * 4.0
        # converged: several accepted steps in a row that barely help, or many rejections in a row
        stall[active] = np.where(better & (gain < _GAIN_TOL), stall[active] + 1, np.where(better, 0, stall[active]))
        rejected[active] = np.where(better, 0, rejected[active] + 1)
        done = (stall[active] >= _STALL) | (rejected[active] >= _MAX_REJECT) | (cost[active] < 1e-20)
        active = active[~done]
    return batch


def _hop(z, kw, best: _Batch, coef, rss, hops: int, bounds, max_iter: int, rng, race: bool = False):
    """Second stage (basin hopping): restart each head from perturbations of its best solution -- the
    weakest kernel moved onto the largest residual or split off the strongest one (narrower and
    wider), small jitters, one kernel re-seeded anywhere -- and keep what improves."""
    m, s = best.c.shape
    g, _, _ = _design(kw, best)
    resid = z - (g @ coef[:, :s, None])[:, :, 0] - coef[:, s:]
    weight = np.abs(coef[:, :s]) * np.linalg.norm(g, axis=1)
    weakest = np.argmin(weight, axis=1)
    rows = np.arange(m)
    cands = []
    moved = _Batch(best.logb.copy(), best.c.copy())
    moved.c[rows, weakest] = kw[np.argmax(np.abs(resid), axis=1)]
    moved.logb[rows, weakest] = np.log(0.5)
    cands.append(moved)
    logb_min, logb_max, _ = bounds
    if s > 1:  # split: the weakest kernel joins the strongest one, narrower or wider (peak shapes)
        strongest = np.argmax(weight, axis=1)
        same = strongest == weakest
        for factor in (5.0, 0.2):
            split = _Batch(best.logb.copy(), best.c.copy())
            split.c[rows, weakest] = best.c[rows, strongest] + np.where(same, 1.0, 0.1)
            split.logb[rows, weakest] = best.logb[rows, strongest] + np.log(factor)
            cands.append(split)
    for t in range(max(hops - len(cands), 0)):
        if t % 2 == 0:  # jitter every kernel a little
            cands.append(_Batch(best.logb + rng.normal(0.0, 0.5, size=s), best.c + rng.normal(0.0, 1.0, size=s)))
        else:  # re-seed one kernel anywhere in the window
            cand = _Batch(best.logb.copy(), best.c.copy())
            which = rng.integers(s)
            cand.c[:, which] = rng.uniform(kw[0], kw[-1])
            cand.logb[:, which] = rng.uniform(logb_min, logb_max)
            cands.append(cand)
    hops = len(cands)
    start = _Batch(
        np.stack([x.logb for x in cands], axis=1).reshape(m * hops, s),
        np.stack([x.c for x in cands], axis=1).reshape(m * hops, s),
    )
    z_rep = np.repeat(z, hops, axis=0)
    group = np.repeat(np.arange(m), hops) if race else None
    out = _levenberg_marquardt(z_rep, kw, start, bounds, max_iter, group=group)
    h_coef, h_rss = _linear_solve(z_rep, kw, out)
    pick = np.argmin(h_rss.reshape(m, hops), axis=1) + np.arange(m) * hops
    better = h_rss[pick] < rss
    logb = np.where(better[:, None], out.logb[pick], best.logb)
    c = np.where(better[:, None], out.c[pick], best.c)
    coef = np.where(better[:, None], h_coef[pick], coef)
    return logb, c, coef, np.where(better, h_rss[pick], rss)


def _polish(z, kw, best: _Batch, coef, rss, bounds, max_iter: int = 60):
    """Remove the ridge's small bias: a short unregularised LM run from the best solution, kept per
    head only if it fits at least as well without inflating the amplitudes (no cancelling pairs)."""
    s = best.c.shape[1]
    out = _levenberg_marquardt(z, kw, _Batch(best.logb.copy(), best.c.copy()), bounds, max_iter, POLISH_RIDGE)
    p_coef, p_rss = _linear_solve(z, kw, out, POLISH_RIDGE)
    size = np.max(np.abs(coef[:, :s]), axis=1)
    ok = (p_rss <= rss) & (np.max(np.abs(p_coef[:, :s]), axis=1) <= 1.5 * size + 1e-12)
    logb = np.where(ok[:, None], out.logb, best.logb)
    c = np.where(ok[:, None], out.c, best.c)
    return logb, c, np.where(ok[:, None], p_coef, coef)


def _starts(z: np.ndarray, kw: np.ndarray, s: int, restarts: int, bounds, rng) -> _Batch:
    """Starting widths/centres for every (head, restart): (heads * restarts, S), head-major."""
    logb_min, logb_max, _ = bounds
    m, _ = z.shape
    width = kw[-1] - kw[0]
    candidates: list[_Batch] = [_forward(z, kw, s, bounds)]
    widths = np.exp(np.linspace(np.log(B_MAX / 5.0), logb_min + 1.0, 7))  # narrow .. wide
    for subset in (widths, widths[:4], widths[3:]):
        candidates.append(_matching_pursuit(z, kw, s, subset))
    candidates.append(_greedy_peaks(z, kw, s))
    spacing = width / max(s, 1)
    grid_c = np.linspace(kw[0] + spacing / 2, kw[-1] - spacing / 2, s) if s > 1 else np.zeros(1)
    candidates.append(_Batch(np.full((m, s), np.log(1.0 / spacing**2)), np.tile(grid_c, (m, 1))))
    # Random starts: the same draws for every head, so a head's fit depends only on its own profile
    # and the seed (not on which other heads share the batch).
    n_random = max(restarts - len(candidates), 0)
    for _ in range(n_random):
        centres = rng.uniform(kw[0], kw[-1], size=s)
        logb = rng.uniform(logb_min, logb_max, size=s)
        candidates.append(_Batch(np.tile(logb, (m, 1)), np.tile(centres, (m, 1))))
    candidates = candidates[:restarts]
    logb = np.stack([cand.logb for cand in candidates], axis=1).reshape(m * restarts, s)
    c = np.stack([cand.c for cand in candidates], axis=1).reshape(m * restarts, s)
    return _clip(_Batch(logb.copy(), c.copy()), bounds)


def _forward(
    z: np.ndarray, kw: np.ndarray, s: int, bounds, max_iter: int = 60, widths: tuple[float, ...] = (2.0, 0.5, 0.1)
) -> _Batch:
    """Forward stagewise fit: add one kernel at a time on the largest |residual| (trying a few widths),
    re-optimise all kernels so far with a short LM run, keep the best per head."""
    m, _ = z.shape
    rows = np.arange(m)
    cur = _Batch(np.zeros((m, 0)), np.zeros((m, 0)))
    resid = z - z.mean(axis=1, keepdims=True)
    n_w = len(widths)
    for t in range(s):
        peak = kw[np.argmax(np.abs(resid), axis=1)]
        logb = np.concatenate([np.repeat(cur.logb, n_w, axis=0), np.tile(np.log(widths), m)[:, None]], axis=1)
        c = np.concatenate([np.repeat(cur.c, n_w, axis=0), np.repeat(peak, n_w)[:, None]], axis=1)
        z_rep = np.repeat(z, n_w, axis=0)
        out = _levenberg_marquardt(z_rep, kw, _Batch(logb, c), bounds, max_iter)
        coef, rss = _linear_solve(z_rep, kw, out)
        pick = np.argmin(rss.reshape(m, n_w), axis=1) + rows * n_w
        cur = _Batch(out.logb[pick], out.c[pick])
        g, _, _ = _design(kw, cur)
        resid = z - (g @ coef[pick, : t + 1, None])[:, :, 0] - coef[pick, t + 1 :]
    return cur


def _matching_pursuit(z: np.ndarray, kw: np.ndarray, s: int, widths: np.ndarray) -> _Batch:
    """Orthogonal matching pursuit over a dictionary of kernels (every integer centre in the window
    times `widths`): add the atom most correlated with the residual, refit all amplitudes, repeat."""
    m, k = z.shape
    grid_b, grid_c = np.meshgrid(widths, kw, indexing="ij")
    grid_b, grid_c = grid_b.ravel(), grid_c.ravel()
    atoms = np.exp(-grid_b[None, :] * (kw[:, None] - grid_c[None, :]) ** 2)  # (K, C)
    centred = atoms - atoms.mean(axis=0)
    norms = np.linalg.norm(centred, axis=0)
    usable = norms > 1e-8
    unit = centred / np.where(usable, norms, 1.0)
    chosen = np.zeros((m, s), dtype=np.int64)
    resid = z.copy()
    rows = np.arange(m)
    for t in range(s):
        score = np.abs(resid @ unit)
        score[:, ~usable] = -1.0
        if t:
            score[rows[:, None], chosen[:, :t]] = -1.0
        chosen[:, t] = np.argmax(score, axis=1)
        coef, phi = _normal_solve(np.transpose(atoms[:, chosen[:, : t + 1]], (1, 0, 2)), z)
        resid = z - (phi @ coef[:, :, None])[:, :, 0]
    return _Batch(np.log(grid_b[chosen]), grid_c[chosen].astype(np.float64))


def _greedy_peaks(z: np.ndarray, kw: np.ndarray, s: int) -> _Batch:
    """Place kernels one by one on the largest remaining |residual| (peaks or dips), width from the
    half-maximum extent around it; the baseline is the median (peaks are sparse)."""
    m, k = z.shape
    resid = z - np.median(z, axis=1, keepdims=True)
    logb = np.zeros((m, s))
    centres = np.zeros((m, s))
    rows = np.arange(m)
    for t in range(s):
        peak = np.argmax(np.abs(resid), axis=1)
        height = resid[rows, peak]
        above = np.abs(resid) * np.sign(height)[:, None] * np.sign(resid) >= 0.5 * np.abs(height)[:, None]
        # half-width: run of same-sign values above half height around the peak
        left = np.zeros(m)
        right = np.zeros(m)
        for h in range(m):  # K is small (2W+1); this loop is over heads but O(K) each
            p = peak[h]
            lo = p
            while lo > 0 and above[h, lo - 1]:
                lo -= 1
            hi = p
            while hi < k - 1 and above[h, hi + 1]:
                hi += 1
            left[h], right[h] = p - lo, hi - p
        half = np.maximum((left + right) / 2.0 + 0.5, 0.5)
        b = np.log(2.0) / half**2
        logb[:, t] = np.log(b)
        centres[:, t] = kw[peak]
        resid = resid - height[:, None] * np.exp(-b[:, None] * (kw[None, :] - kw[peak][:, None]) ** 2)
    return _Batch(logb, centres)
