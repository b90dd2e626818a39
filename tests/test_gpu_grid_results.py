"""The committed GPU grid (benchmarks/results/gpu-grid, issue 36): every (task, mechanism, seed) run is there, and
the summary recomputes from the runs with an independent implementation of SPEC §12 (numpy medians and means, the
t interval from scipy, the exact sign-flip p-value over all 2^n sign patterns)."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

GRID = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu-grid"
RESULTS = sorted(GRID.glob("*/results.json"))


def test_the_grid_results_are_committed():
    assert {p.parent.name for p in RESULTS} == {"lr1e-4", "lr3e-4"}


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.parent.name)
def test_every_run_is_there_and_the_summary_recomputes(path):
    data = json.loads(path.read_text())
    assert data["mechanisms"] == ["none", "tisa", "composite"] and data["tasks"] == ["cola"]
    assert data["seeds"] == [0, 1, 2, 3, 4]
    runs = {(r["task"], r["mechanism"], r["seed"]): r["metrics"]["matthews"] for r in data["runs"]}
    assert set(runs) == {("cola", m, s) for m in data["mechanisms"] for s in data["seeds"]}
    assert data["settings"]["epochs"] == 3.0 and data["settings"]["batch_size"] == 32
    base = np.array([runs[("cola", "none", s)] for s in data["seeds"]])
    rows = {row["mechanism"]: row for row in data["summary"] if row["metric"] == "matthews"}
    for mechanism in data["mechanisms"]:
        values = np.array([runs[("cola", mechanism, s)] for s in data["seeds"]])
        row = rows[mechanism]
        assert row["n"] == 5
        assert row["median"] == pytest.approx(np.median(values), abs=1e-12)
        assert row["mean"] == pytest.approx(values.mean(), abs=1e-12)
        assert row["stderr"] == pytest.approx(values.std(ddof=1) / np.sqrt(5), abs=1e-12)
        if mechanism == "none":
            assert row["delta"] is None
            continue
        diff = values - base
        delta = row["delta"]
        se = diff.std(ddof=1) / np.sqrt(5)
        half = stats.t.ppf(0.975, df=4) * se
        assert delta["mean"] == pytest.approx(diff.mean(), abs=1e-12)
        assert delta["stderr"] == pytest.approx(se, abs=1e-12)
        assert delta["ci95"] == pytest.approx([diff.mean() - half, diff.mean() + half], abs=1e-9)
        flips = [abs(np.dot(signs, diff)) >= abs(diff.sum()) - 1e-12 for signs in itertools.product((1, -1), repeat=5)]
        assert delta["p_value"] == pytest.approx(np.mean(flips), abs=1e-12) and delta["p_exact"] is True
