"""SPEC §12 statistics: summaries, paired differences, the exact sign-flip p-value (brute force and known
answers) and the t interval."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from posprobe.glue.grid_report import grid_markdown, grid_summary
from posprobe.glue.stats import paired_delta, sign_flip_p_value, summarize


def _brute_force_p(d: list[float]) -> float:
    observed = abs(sum(d))
    hits = sum(
        abs(sum(s * x for s, x in zip(signs, d))) >= observed - 1e-12
        for signs in itertools.product((1, -1), repeat=len(d))
    )
    return hits / 2 ** len(d)


def test_sign_flip_known_answers():
    assert sign_flip_p_value([0.1, 0.2, 0.3, 0.4, 0.5]) == (2 / 32, True)  # all positive, N = 5
    assert sign_flip_p_value([-1.0, -2.0, -3.0]) == (2 / 8, True)
    assert sign_flip_p_value([0.0, 0.0, 0.0])[0] == 1.0  # no difference at all
    assert sign_flip_p_value([1.0, -1.0])[0] == 1.0  # every pattern is as extreme as |0|
    # d = (1, 1, 1, -1): |sum| = 2; patterns with |sum| >= 2: sums of four +-1 equal to +-2 or +-4 -> 10 of 16
    assert sign_flip_p_value([1.0, 1.0, 1.0, -1.0])[0] == 10 / 16


@pytest.mark.parametrize("n", [1, 2, 5, 8, 11, pytest.param(17, marks=pytest.mark.slow)])  # 2^17 sign patterns: slow
def test_sign_flip_matches_brute_force(n):
    rng = random.Random(n)
    for _ in range(3):
        d = [round(rng.gauss(0.2, 1.0), 3) for _ in range(n)]
        p, exact = sign_flip_p_value(d)
        assert exact and p == pytest.approx(_brute_force_p(d), abs=1e-15)


def test_sign_flip_above_the_exact_limit_is_an_estimate():
    d = [0.5] * 22  # all positive: the exact p is 2 / 2^22
    p, exact = sign_flip_p_value(d)
    assert not exact and 0 < p < 1e-4


def test_paired_delta_mean_stderr_and_t_interval():
    delta = paired_delta([0.6, 0.8, 1.0], [-0.4, -0.2, 0.0])  # d = 1, 1, 1: s.e. 0, interval collapses
    assert delta.mean == pytest.approx(1.0) and delta.stderr == pytest.approx(0.0)
    assert delta.p_value == pytest.approx(2 / 8) and delta.n == 3
    delta = paired_delta([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])  # d = 1, 2, 3: mean 2, sd 1
    se = 1 / math.sqrt(3)
    assert delta.stderr == pytest.approx(se)
    t975 = 4.302652729911275  # t quantile, 2 degrees of freedom
    assert delta.ci95 == pytest.approx((2 - t975 * se, 2 + t975 * se))
    # seeds where either value is undefined are left out pairwise
    delta = paired_delta([1.0, None, 3.0, float("nan")], [0.0, 0.5, 1.0, 0.0])
    assert delta.n == 2 and delta.mean == pytest.approx(1.5)
    assert paired_delta([None], [1.0]) is None
    single = paired_delta([0.7], [0.5])
    assert single.stderr is None and single.ci95 is None and single.p_value == 1.0
    with pytest.raises(ValueError, match="pair them by seed"):
        paired_delta([1.0], [1.0, 2.0])


def test_summarize():
    s = summarize([0.5, 0.7, 0.9, None])
    assert (s.median, s.n) == (0.7, 3) and s.mean == pytest.approx(0.7)
    assert s.stderr == pytest.approx(0.2 / math.sqrt(3))
    assert summarize([None]).mean is None and summarize([0.4]).stderr is None


def _runs(values: dict[tuple[str, str], list[float]]) -> list[dict]:
    metric = {"cola": "matthews", "sst2": "accuracy"}
    return [
        {"task": t, "mechanism": m, "seed": s, "metrics": {metric[t]: v}}
        for (t, m), vs in values.items()
        for s, v in enumerate(vs)
    ]


def test_grid_summary_rows_deltas_and_average():
    values = {
        ("cola", "none"): [0.1, 0.2, 0.3],
        ("cola", "tisa"): [0.2, 0.4, 0.3],
        ("sst2", "none"): [0.8, 0.8, 0.9],
        ("sst2", "tisa"): [0.9, 0.8, 0.95],
    }
    metrics = {"cola": ["matthews"], "sst2": ["accuracy"]}
    rows = grid_summary(_runs(values), ["cola", "sst2"], ["none", "tisa"], metrics, [0, 1, 2])
    assert [(r["task"], r["mechanism"]) for r in rows] == [
        ("cola", "none"),
        ("cola", "tisa"),
        ("sst2", "none"),
        ("sst2", "tisa"),
        ("average", "none"),
        ("average", "tisa"),
    ]
    assert set(rows[0]) == {"task", "mechanism", "metric", "median", "mean", "stderr", "n", "delta"}
    assert rows[0]["delta"] is None and rows[1]["delta"]["mean"] == pytest.approx(0.1)
    cola_d = np.array([0.1, 0.2, 0.0])
    assert rows[1]["delta"]["stderr"] == pytest.approx(cola_d.std(ddof=1) / math.sqrt(3))
    assert set(rows[1]["delta"]) >= {"mean", "stderr", "ci95", "p_value"}
    avg_none = [(a + b) / 2 for a, b in zip(values[("cola", "none")], values[("sst2", "none")])]
    assert rows[4]["mean"] == pytest.approx(sum(avg_none) / 3)
    avg_d = [0.1, 0.1, 0.025]  # per seed: mean over tasks of the differences
    assert rows[5]["delta"]["mean"] == pytest.approx(sum(avg_d) / 3)
    assert rows[5]["delta"]["p_value"] == pytest.approx(2 / 8)
    result = {
        "tasks": ["cola", "sst2"],
        "mechanisms": ["none", "tisa"],
        "main_metrics": {"cola": "matthews", "sst2": "accuracy"},
        "model": "m",
        "seeds": [0, 1, 2],
        "summary": rows,
        "seconds": 1.0,
    }
    text = grid_markdown(result)
    assert "| mechanism | cola (matthews) | sst2 (accuracy) | average |" in text
    assert "p = 0.25" in text and "| tisa |" in text


def test_grid_init_fit_reaches_every_mechanism_holding_tisa(tmp_path):
    """--init fit in a grid: kept for tisa and combinations holding TISA (tisa+fixed), zero for the others."""
    from posprobe.glue.grid import grid_configs

    configs = grid_configs(["cola"], ["none", "tisa", "tisa+fixed", "fixed"], tmp_path, [0], init="fit")
    inits = {mechanism: config.init for (_, mechanism), config in configs.items()}
    assert inits == {"none": "zero", "tisa": "fit", "tisa+fixed": "fit", "fixed": "zero"}
