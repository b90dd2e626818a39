"""TISA kernel fitting (posprobe.analysis.tisa_fit): recovery of known kernels, k = j - i orientation,
offset/scale handling, determinism, local optimality against scipy, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from posprobe.analysis.tisa_fit import DEFAULT_FIT_WINDOW, TisaKernelFitter, tisa_function
from posprobe.errors import ArgumentValueError, PosprobeError

N = 64
OFFSETS = np.arange(-(N - 1), N)  # k = -(n-1) .. n-1, increasing


def test_tisa_function_matches_brute_force():
    rng = np.random.default_rng(1)
    a, b, c = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4)), rng.normal(0, 5, size=(2, 3, 4))
    k = np.arange(-7, 8)
    got = tisa_function(k, a, b, c)
    assert got.shape == (2, 3, k.size)
    for i in range(2):
        for h in range(3):
            for t, kk in enumerate(k):
                want = sum(a[i, h, s] * np.exp(-abs(b[i, h, s]) * (kk - c[i, h, s]) ** 2) for s in range(4))
                assert got[i, h, t] == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert tisa_function(2.0, [1.0], [0.5], [2.0]).shape == ()
    assert float(tisa_function(2.0, [1.0], [-0.5], [2.0])) == pytest.approx(1.0)  # |b|


def known_heads(rng, m: int, s: int, window: int = DEFAULT_FIT_WINDOW):
    """Well-separated kernels inside the window (identifiable), one row per head."""
    spacing = (2 * window - 4) / s  # > 4 kernel widths apart, all inside the window
    c = -window + 2 + spacing * (np.arange(s) + 0.5) + rng.uniform(-1, 1, size=(m, s))
    b = rng.uniform(0.3, 1.5, size=(m, s))
    a = rng.choice([-1.0, 1.0], size=(m, s)) * rng.uniform(0.5, 2.0, size=(m, s))
    offset = rng.normal(size=m)
    profiles = tisa_function(OFFSETS, a, b, c) + offset[:, None]
    return profiles, a, b, c, offset


@pytest.mark.parametrize("s", [1, 3])
def test_recovers_known_kernels_noiseless(s):
    rng = np.random.default_rng(s)
    profiles, a, b, c, offset = known_heads(rng, 12, s)
    fit = TisaKernelFitter(s, seed=0).fit(profiles, OFFSETS)
    assert np.all(fit.r2_ > 0.999)
    window = np.abs(OFFSETS) <= fit.window_
    np.testing.assert_allclose(fit.predict(OFFSETS[window]), profiles[:, window], atol=2e-3)
    np.testing.assert_allclose(fit.c_, c, atol=0.02)  # kernels are sorted by centre
    np.testing.assert_allclose(fit.b_, b, rtol=0.03)
    np.testing.assert_allclose(fit.a_, a, rtol=0.03, atol=0.01)
    np.testing.assert_allclose(fit.offset_, offset, atol=0.01)
    assert fit.flags_ == [""] * 12


def test_five_kernels_fit_a_mixture_and_noise():
    rng = np.random.default_rng(7)
    profiles, a, b, c, _ = known_heads(rng, 8, 3)
    clean = TisaKernelFitter(5).fit(profiles, OFFSETS)
    assert np.all(clean.r2_ > 0.999)  # more kernels than needed still fit exactly
    noisy = profiles + rng.normal(0, 0.02, size=profiles.shape)
    fit = TisaKernelFitter(3).fit(noisy, OFFSETS)
    assert np.all(fit.r2_ > 0.98)
    np.testing.assert_allclose(fit.c_, c, atol=0.15)
    window = np.abs(OFFSETS) <= fit.window_
    err = fit.predict(OFFSETS[window]) - profiles[:, window]  # against the clean curve
    assert np.sqrt(np.mean(err**2)) < 0.02


def test_orientation_k_equals_j_minus_i_by_brute_force():
    """A matrix where query i scores key j = i + 1 highest -> profile peaks at k = +1 -> c > 0."""
    n = 40
    scores = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            scores[i, j] = 3.0 * np.exp(-0.8 * (j - i - 1) ** 2) + 0.1 * i  # plus a row-only term
    offsets = np.arange(-(n - 1), n)
    profile = np.array([np.mean([scores[i, i + k] for i in range(n) if 0 <= i + k < n]) for k in offsets])
    assert offsets[np.argmax(profile)] == 1
    fit = TisaKernelFitter(1).fit(profile[None], offsets)
    # the row-only term adds a gentle slope to the diagonal means, so c is near (not exactly) 1
    assert fit.c_[0, 0] == pytest.approx(1.0, abs=0.1) and fit.a_[0, 0] > 0
    k = np.arange(-5, 6)
    assert k[np.argmax(fit.predict(k, include_offset=False)[0])] == 1
    mirrored = TisaKernelFitter(1).fit(profile[None, ::-1], offsets)
    assert mirrored.c_[0, 0] == pytest.approx(-fit.c_[0, 0], abs=1e-6)


@pytest.mark.slow
def test_offset_and_scale_equivariance():
    rng = np.random.default_rng(3)
    profiles, *_ = known_heads(rng, 4, 2)
    profiles = profiles + rng.normal(0, 0.05, size=profiles.shape)
    base = TisaKernelFitter(2).fit(profiles, OFFSETS)  # identifiable: 2 kernels for 2 true bumps
    shifted = TisaKernelFitter(2).fit(1e3 * profiles + 7.0, OFFSETS)
    np.testing.assert_allclose(shifted.a_, 1e3 * base.a_, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(shifted.b_, base.b_, rtol=1e-5)
    np.testing.assert_allclose(shifted.c_, base.c_, atol=1e-5)
    np.testing.assert_allclose(shifted.offset_, 1e3 * base.offset_ + 7.0, rtol=1e-5)
    np.testing.assert_allclose(shifted.r2_, base.r2_, atol=1e-8)
    # with a spare kernel the optimum is not unique, but the quality of the fit still is
    spare = TisaKernelFitter(3).fit(profiles, OFFSETS)
    spare_shifted = TisaKernelFitter(3).fit(1e3 * profiles + 7.0, OFFSETS)
    np.testing.assert_allclose(spare_shifted.r2_, spare.r2_, atol=1e-4)


@pytest.mark.slow
def test_deterministic_and_independent_of_batch():
    rng = np.random.default_rng(4)
    profiles = rng.normal(size=(6, OFFSETS.size)).cumsum(axis=1)  # rough random-walk profiles
    one = TisaKernelFitter(3, seed=5).fit(profiles, OFFSETS)
    two = TisaKernelFitter(3, seed=5).fit(profiles, OFFSETS)
    for name in ("a_", "b_", "c_", "offset_", "r2_"):
        np.testing.assert_array_equal(getattr(one, name), getattr(two, name))
    alone = TisaKernelFitter(3, seed=5).fit(profiles[2:3], OFFSETS)
    np.testing.assert_allclose(alone.r2_[0], one.r2_[2], atol=1e-9)
    np.testing.assert_allclose(alone.c_[0], one.c_[2], atol=1e-6)


def test_r2_definition_and_local_optimality_against_scipy():
    """r2_ is 1 - RSS/TSS over the window with the offset in the model, and a general-purpose solver
    started at our optimum finds no meaningfully better fit."""
    from scipy.optimize import least_squares

    rng = np.random.default_rng(11)
    profiles, *_ = known_heads(rng, 3, 3)
    profiles = profiles + rng.normal(0, 0.1, size=profiles.shape)
    fit = TisaKernelFitter(3).fit(profiles, OFFSETS)
    keep = np.abs(OFFSETS) <= fit.window_
    k, y = OFFSETS[keep].astype(float), profiles[:, keep]
    for h in range(3):
        model = tisa_function(k, fit.a_[h], fit.b_[h], fit.c_[h]) + fit.offset_[h]
        r2 = 1 - np.sum((y[h] - model) ** 2) / np.sum((y[h] - y[h].mean()) ** 2)
        assert fit.r2_[h] == pytest.approx(r2, abs=1e-10)

        def residual(p, target=y[h]):
            return tisa_function(k, p[:3], p[3:6], p[6:9]) + p[9] - target

        p0 = np.concatenate([fit.a_[h], fit.b_[h], fit.c_[h], [fit.offset_[h]]])
        best = least_squares(residual, p0, method="lm", max_nfev=4000)
        r2_scipy = 1 - np.sum(best.fun**2) / np.sum((y[h] - y[h].mean()) ** 2)
        assert r2_scipy - fit.r2_[h] < 1e-3


@pytest.mark.slow
def test_exhaustive_agrees_on_median():
    rng = np.random.default_rng(12)
    profiles, *_ = known_heads(rng, 10, 4)
    profiles = profiles + rng.normal(0, 0.1, size=profiles.shape)
    fast = TisaKernelFitter(3).fit(profiles, OFFSETS)
    slow = TisaKernelFitter(3, exhaustive=True, restarts=24, max_iter=500).fit(profiles, OFFSETS)
    assert abs(np.median(slow.r2_) - np.median(fast.r2_)) < 0.01


def test_window_default_and_clipping():
    small = np.arange(-3, 4)
    fit = TisaKernelFitter(1).fit(np.exp(-(small[None] ** 2.0)), small)
    assert fit.window_ == 3 and list(fit.fit_offsets_) == list(small)
    assert TisaKernelFitter(1).fit(np.exp(-(OFFSETS[None] ** 2.0)), OFFSETS).window_ == DEFAULT_FIT_WINDOW
    fit = TisaKernelFitter(1, window=5).fit(np.exp(-(OFFSETS[None] ** 2.0)), OFFSETS)
    assert fit.window_ == 5 and fit.fit_offsets_.min() == -5 and fit.fit_offsets_.max() == 5


def test_flat_profiles_are_flagged_not_nan():
    profiles = np.stack([np.zeros(OFFSETS.size), np.full(OFFSETS.size, 3.5), np.exp(-0.5 * OFFSETS**2.0)])
    fit = TisaKernelFitter(5).fit(profiles, OFFSETS)
    for name in ("a_", "b_", "c_", "offset_", "r2_"):
        assert np.all(np.isfinite(getattr(fit, name)))
    assert np.all(fit.a_[:2] == 0) and list(fit.offset_[:2]) == [0.0, 3.5]
    assert list(fit.r2_[:2]) == [1.0, 1.0]
    assert "flat" in fit.flags_[0] and "flat" in fit.flags_[1] and fit.flags_[2] == ""


def test_underdetermined_window_is_refused():
    """3·S + 1 parameters need as many points: S = 5 on a window of 5 points is refused, as the CLI refuses it."""
    profile = np.exp(-0.3 * (OFFSETS[None] - 1.0) ** 2)
    with pytest.raises(ArgumentValueError, match="n_kernels 5 needs 16 profile points .* has 5"):
        TisaKernelFitter(5, window=2).fit(profile, OFFSETS)
    fit = TisaKernelFitter(1, window=2).fit(profile, OFFSETS)  # 4 parameters, 5 points: fine
    assert np.all(np.isfinite(fit.a_)) and 0 <= fit.r2_[0] <= 1


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_kernels=0),
        dict(n_kernels=-2),
        dict(n_kernels=2.5),
        dict(n_kernels=True),
        dict(window=0),
        dict(window=N),
        dict(window=1000),
        dict(restarts=0),
        dict(max_iter=0),
    ],
)
def test_bad_parameters_raise(kwargs):
    with pytest.raises(PosprobeError) as info:
        TisaKernelFitter(**kwargs).fit(np.exp(-(OFFSETS[None] ** 2.0)), OFFSETS)
    assert info.value.hint


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_profiles_raise(bad):
    profiles = np.exp(-(OFFSETS[None] ** 2.0)).repeat(3, axis=0)
    profiles[1, 5] = bad
    with pytest.raises(PosprobeError, match="NaN/inf"):
        TisaKernelFitter(3).fit(profiles, OFFSETS)


def test_mismatched_or_bad_offsets_raise():
    with pytest.raises(PosprobeError):
        TisaKernelFitter(1).fit(np.zeros((2, 5)), np.arange(-3, 4))
    with pytest.raises(PosprobeError):
        TisaKernelFitter(1).fit(np.zeros((1, 3)), np.array([0.5, 1.0, 2.0]))
    with pytest.raises(PosprobeError):
        TisaKernelFitter(1).fit(np.zeros((1, 3)), np.array([1, 0, -1]))
    with pytest.raises(PosprobeError):
        TisaKernelFitter(1).fit(np.zeros((1, 2)), np.array([0, 1]))  # no negative offsets: no window
    with pytest.raises(PosprobeError):
        TisaKernelFitter(1).predict(OFFSETS)  # not fitted


def test_module_stays_pure():
    import subprocess
    import sys

    code = (
        "import sys, posprobe.analysis.tisa_fit, posprobe.analysis.params; "
        "bad = [m for m in ('torch', 'typer', 'rich', 'matplotlib') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
