"""GLUE metric functions against hand-computed values (and scipy where it has the same metric)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from posprobe.errors import PosprobeError
from posprobe.glue.metrics import accuracy, compute_metrics, f1, matthews, pearson, spearman


def test_accuracy():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    assert accuracy([2, 2], [2, 2]) == 1.0


def test_f1_hand_computed():
    # tp=2 (idx 0, 4), fp=1 (idx 1), fn=1 (idx 3) -> 2*2 / (2*2 + 1 + 1) = 2/3
    assert f1([1, 1, 0, 0, 1], [1, 0, 0, 1, 1]) == pytest.approx(2 / 3)
    assert f1([0, 0], [0, 0]) == 0.0  # no positives anywhere
    assert f1([1, 1], [1, 1]) == 1.0


def test_matthews_binary_hand_computed():
    # tp=2, tn=1, fp=1, fn=1 -> (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6
    assert matthews([1, 1, 0, 0, 1], [1, 0, 0, 1, 1]) == pytest.approx(1 / 6)
    assert matthews([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert matthews([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-1.0)


def test_matthews_multiclass_hand_computed():
    # correct c=2 of s=4; predicted counts (2,1,1), true counts (1,2,1):
    # (2*4 - (2+2+1)) / sqrt((16-6)(16-6)) = 3/10
    assert matthews([0, 1, 2, 0], [0, 1, 1, 2]) == pytest.approx(0.3)


def test_matthews_degenerate_is_zero():
    assert matthews([1, 1, 1, 1], [0, 1, 0, 1]) == 0.0


def test_pearson_hand_computed():
    # x-mean = (-1,0,1), y-mean = (-4/3,-1/3,5/3): cov 3, |x|^2 2, |y|^2 42/9 -> 3 / sqrt(84/9)
    assert pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(3 / math.sqrt(84 / 9))


def test_spearman_with_ties_hand_computed():
    # ranks x = (1, 2.5, 2.5, 4), y = (1, 3, 2, 4) -> 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))


def test_correlations_match_scipy():
    from scipy import stats

    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    y = x + rng.normal(size=50)
    assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])


def test_constant_input_correlation_is_nan():
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman([1, 2, 3], [5, 5, 5]))


def test_length_mismatch_and_empty_raise():
    with pytest.raises(PosprobeError, match="2 predictions but 3 labels"):
        accuracy([1, 0], [1, 0, 1])
    with pytest.raises(PosprobeError, match="no examples"):
        accuracy([], [])


def test_compute_metrics_per_task():
    logits = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])  # argmax 1,0,1,0,1
    labels = [1, 0, 0, 1, 1]
    assert compute_metrics("cola", logits, labels) == {"matthews": pytest.approx(1 / 6)}
    assert compute_metrics("sst2", logits, labels) == {"accuracy": pytest.approx(0.6)}
    assert compute_metrics("mrpc", logits, labels) == {"f1": pytest.approx(2 / 3), "accuracy": pytest.approx(0.6)}
    assert set(compute_metrics("qqp", logits, labels)) == {"f1", "accuracy"}
    for name in ("qnli", "rte", "wnli"):
        assert set(compute_metrics(name, logits, labels)) == {"accuracy"}


def test_compute_metrics_regression_accepts_column_output():
    scores = np.array([[1.0], [2.0], [3.0]])
    out = compute_metrics("stsb", scores, [1.0, 2.0, 4.0])
    assert out == {"pearson": pytest.approx(3 / math.sqrt(84 / 9)), "spearman": pytest.approx(1.0)}


def test_compute_metrics_mnli_splits():
    logits = np.eye(3)[[0, 1, 2, 2]]
    labels = [0, 1, 2, 0]
    assert compute_metrics("mnli", logits, labels, "validation_matched") == {"accuracy": 0.75}
    assert compute_metrics("mnli", logits, labels, "validation_mismatched") == {"accuracy_mismatched": 0.75}
    assert compute_metrics("mnli", [0, 1, 2, 2], labels) == {"accuracy": 0.75}  # class ids; default = matched
    with pytest.raises(PosprobeError, match="not a dev split"):
        compute_metrics("mnli", logits, labels, "validation")
