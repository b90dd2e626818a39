"""Toeplitz R^2: known answers, and agreement with a brute-force least-squares projection."""

import numpy as np
import pytest

from posprobe.analysis.position_products import position_inner_products
from posprobe.analysis.toeplitz import (
    R2_RELATIVE_TOL,
    block_r2,
    diagonal_means,
    offsets,
    sections,
    toeplitz_fit,
    toeplitz_from_diagonals,
    toeplitz_r2,
)


def brute_force_toeplitz_projection(a: np.ndarray) -> np.ndarray:
    """Least squares over all Toeplitz matrices, by an explicit design matrix (one column per diagonal)."""
    n = a.shape[0]
    design = np.zeros((n * n, 2 * n - 1))
    for i in range(n):
        for j in range(n):
            design[i * n + j, j - i + n - 1] = 1.0
    coef, *_ = np.linalg.lstsq(design, a.ravel(), rcond=None)
    return (design @ coef).reshape(n, n)


def brute_force_r2(a: np.ndarray) -> float:
    fit = brute_force_toeplitz_projection(a)
    rss = sum((a[i, j] - fit[i, j]) ** 2 for i in range(a.shape[0]) for j in range(a.shape[1]))
    mean = a.sum() / a.size
    tss = sum((a[i, j] - mean) ** 2 for i in range(a.shape[0]) for j in range(a.shape[1]))
    return 1 - rss / tss


def test_exact_toeplitz_matrix_has_r2_one():
    rng = np.random.default_rng(0)
    t = toeplitz_from_diagonals(rng.normal(size=2 * 9 - 1))
    assert toeplitz_r2(t) == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(toeplitz_fit(t), t, atol=1e-12)


def test_toeplitz_from_diagonals_orientation():
    # v indexed by k = j - i: entry (i, j) = v[j - i + n - 1]; the first row holds k >= 0.
    v = np.arange(5.0)  # n = 3: k = -2..2 -> 0..4
    t = toeplitz_from_diagonals(v)
    assert t[0, 2] == 4.0 and t[2, 0] == 0.0 and t[1, 1] == 2.0
    np.testing.assert_array_equal(offsets(3), [-2, -1, 0, 1, 2])


@pytest.mark.parametrize("n", [1, 2, 5, 17])
def test_r2_matches_brute_force_on_random_matrices(n):
    rng = np.random.default_rng(n)
    a = rng.normal(size=(n, n)) + toeplitz_from_diagonals(rng.normal(size=2 * n - 1))
    np.testing.assert_allclose(toeplitz_fit(a), brute_force_toeplitz_projection(a), atol=1e-10)
    if n > 1:
        assert toeplitz_r2(a) == pytest.approx(brute_force_r2(a), abs=1e-12)


def test_diagonal_means_match_loop():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(6, 6))
    expected = [np.mean([a[i, i + k] for i in range(6) if 0 <= i + k < 6]) for k in range(-5, 6)]
    np.testing.assert_allclose(diagonal_means(a), expected, atol=1e-13)


def test_batched_equals_one_by_one():
    rng = np.random.default_rng(2)
    batch = rng.normal(size=(3, 4, 7, 7))
    r2 = toeplitz_r2(batch)
    assert r2.shape == (3, 4)
    for idx in np.ndindex(3, 4):
        assert r2[idx] == pytest.approx(toeplitz_r2(batch[idx]), abs=1e-13)


def test_constant_matrix_has_undefined_r2():
    # A constant matrix has no variance to explain: R^2 is undefined, not 1 and not -579.6 (issue 8 #3).
    assert toeplitz_r2(np.full((4, 4), 3.0)) is None
    assert toeplitz_r2(np.zeros((5, 5))) is None


def test_constant_plus_roundoff_noise_is_undefined():
    # What `retrofit --drop-position-embeddings` produces: P of identical rows, up to float round-off.
    rng = np.random.default_rng(0)
    row = rng.normal(size=32).astype(np.float32).astype(np.float64)
    p = position_inner_products(np.tile(row, (64, 1)))
    noisy = p * (1 + 1e-15 * rng.normal(size=p.shape))  # entry-wise round-off of a few ulps
    assert toeplitz_r2(p) is None
    assert toeplitz_r2(noisy) is None
    assert block_r2(noisy, 16) is None
    # just below the tolerance: an RMS deviation of 0.5e-10 of the scale is still noise
    below = 7.0 + 0.5 * R2_RELATIVE_TOL * 7.0 * rng.choice([-1.0, 1.0], size=(20, 20))
    assert toeplitz_r2(below) is None


def test_tiny_real_signal_keeps_a_number():
    # A real signal 1e-7 of the scale (one float32 ulp) is far above the tolerance and measured correctly.
    n = 24
    k = np.arange(n)
    toeplitz_part = np.cos(0.3 * (k[None, :] - k[:, None]))
    t = 1000.0 + 1e-4 * toeplitz_part
    r2 = toeplitz_r2(t)
    assert r2 is not None and r2 == pytest.approx(1.0, abs=1e-6)
    a = 1000.0 + 1e-4 * np.random.default_rng(1).normal(size=(n, n))
    assert toeplitz_r2(a) == pytest.approx(brute_force_r2(a - 1000.0), abs=1e-6)
    # just above the tolerance: an RMS deviation of 2x the tolerance gives a number
    above = 7.0 + 2 * R2_RELATIVE_TOL * 7.0 * np.random.default_rng(2).choice([-1.0, 1.0], size=(20, 20))
    assert isinstance(toeplitz_r2(above), float)


def test_batch_marks_undefined_heads_nan_and_toeplitz_stays_exactly_one():
    t = toeplitz_from_diagonals(np.random.default_rng(3).normal(size=11))
    batch = np.stack([t, np.full((6, 6), 2.5), np.random.default_rng(4).normal(size=(6, 6))])
    r2 = toeplitz_r2(batch)
    assert r2[0] == 1.0
    assert np.isnan(r2[1])
    assert np.isfinite(r2[2]) and r2[2] < 1
    assert toeplitz_r2(t) == 1.0


def test_block_r2_uses_leading_block():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(10, 10))
    a[:4, :4] = toeplitz_from_diagonals(rng.normal(size=7))
    assert block_r2(a, 4) == pytest.approx(1.0, abs=1e-12)
    assert block_r2(a, 10) == pytest.approx(toeplitz_r2(a))
    with pytest.raises(ValueError):
        block_r2(a, 11)


def test_sections_reindex_rows_by_offset():
    a = np.arange(36.0).reshape(6, 6)
    s = sections(a, [0, 3], window=2)
    # row 3, k = -2..2 -> columns 1..5
    np.testing.assert_array_equal(s[1], a[3, 1:6])
    # row 0 has no keys to the left
    assert np.isnan(s[0, :2]).all() and (s[0, 2:] == a[0, :3]).all()


def test_position_inner_products_and_cosine():
    rng = np.random.default_rng(4)
    e = rng.normal(size=(5, 3))
    p = position_inner_products(e)
    np.testing.assert_allclose(p, [[e[i] @ e[j] for j in range(5)] for i in range(5)])
    c = position_inner_products(e, cosine=True)
    np.testing.assert_allclose(np.diag(c), 1.0)
    assert np.abs(c).max() <= 1 + 1e-12


def test_sinusoidal_positions_are_nearly_toeplitz():
    # Sinusoidal embeddings have inner products that depend only on j - i: a known answer of R^2 = 1.
    n, d = 50, 16
    pos = np.arange(n)[:, None]
    freq = 1.0 / 10000 ** (np.arange(0, d, 2) / d)
    e = np.concatenate([np.sin(pos * freq), np.cos(pos * freq)], axis=1)
    assert toeplitz_r2(position_inner_products(e)) == pytest.approx(1.0, abs=1e-10)
