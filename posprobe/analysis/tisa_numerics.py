"""The numerical core of the TISA kernel fitter (`posprobe.analysis.tisa_fit.TisaKernelFitter`): variable
projection with a batched Levenberg-Marquardt, its starts, basin hopping and the final polish.

Everything here works on standardised profiles z (N, K) (zero mean, unit RMS over the fitted offsets kw (K,),
k = j - i) and on a batch of N problems (heads x restarts); the model is z ~ G(logb, c) @ a + offset with
G[k, s] = exp(-b_s (k - c_s)^2). Given the nonlinear parameters (log b, c) (N, S) the amplitudes and the offset
are a small ridge-regularised linear solve; only the 2S nonlinear numbers per problem are iterated, with
Kaufman's Jacobian. Pure NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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

# Effort (see `posprobe.analysis.tisa_fit`): starts per head, LM iterations per run, hop candidates and rounds.
DEFAULT_RESTARTS = 8
DEFAULT_MAX_ITER = 200
EXHAUSTIVE_RESTARTS = 64
EXHAUSTIVE_MAX_ITER = 2000
_GAIN_TOL = 1e-9
_STALL = 6
_MAX_REJECT = 10
_RACE_EVERY = 15
_RACE_MARGIN = 1.1
DEFAULT_HOPS = 32
EXHAUSTIVE_HOPS = 32
DEFAULT_HOP_ROUNDS = 2
EXHAUSTIVE_HOP_ROUNDS = 4


@dataclass
class _Batch:
    """Nonlinear parameters of N problems: log-widths and centres, each (N, S)."""

    logb: np.ndarray
    c: np.ndarray


def fit_standardised(z: np.ndarray, kw: np.ndarray, effort: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
