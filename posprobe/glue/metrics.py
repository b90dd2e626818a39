"""GLUE dev metrics (SPEC §7) in plain numpy/scipy, and `compute_metrics` for a task.

Every function takes 1-D sequences of predictions and labels of equal, non-zero length and returns a
Python float in the metric's natural range (fractions, not percentages). Degenerate cases follow the
usual conventions: Matthews correlation is 0 when a confusion-matrix margin is empty, F1 is 0 when
there are no true and no predicted positives, and Pearson / Spearman are NaN when either input is
constant (a correlation is undefined there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from posprobe.errors import PosprobeError
from posprobe.glue.tasks import GlueTask, get_task

ArrayLike = Sequence[float] | np.ndarray


def _pair(predictions: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(predictions).reshape(-1) if np.ndim(predictions) != 0 else np.asarray([predictions])
    y = np.asarray(labels).reshape(-1) if np.ndim(labels) != 0 else np.asarray([labels])
    if p.shape != y.shape:
        raise PosprobeError(f"{p.size} predictions but {y.size} labels", "pass one prediction per labelled example")
    if p.size == 0:
        raise PosprobeError("no examples to score", "evaluate on a non-empty dev split")
    return p, y


def accuracy(predictions: ArrayLike, labels: ArrayLike) -> float:
    """Fraction of predictions equal to their label."""
    p, y = _pair(predictions, labels)
    return float(np.mean(p == y))


def f1(predictions: ArrayLike, labels: ArrayLike, positive: int = 1) -> float:
    """Binary F1 of class `positive`: 2 TP / (2 TP + FP + FN)."""
    p, y = _pair(predictions, labels)
    tp = int(np.sum((p == positive) & (y == positive)))
    fp = int(np.sum((p == positive) & (y != positive)))
    fn = int(np.sum((p != positive) & (y == positive)))
    denom = 2 * tp + fp + fn
    return 0.0 if denom == 0 else 2.0 * tp / denom


def matthews(predictions: ArrayLike, labels: ArrayLike) -> float:
    """Matthews correlation coefficient (multi-class form; equals the binary phi coefficient for 2 classes).

    With confusion counts, c = correct, s = total, p_k / t_k = predicted / true count of class k:
    (c s - sum p_k t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2)); 0 when the denominator is 0.
    """
    p, y = _pair(predictions, labels)
    classes, inverse = np.unique(np.concatenate([p, y]), return_inverse=True)
    pi, yi = inverse[: p.size], inverse[p.size :]
    k = classes.size
    pred_counts = np.bincount(pi, minlength=k).astype(np.float64)
    true_counts = np.bincount(yi, minlength=k).astype(np.float64)
    correct = float(np.sum(pi == yi))
    s = float(p.size)
    cov_pt = correct * s - float(pred_counts @ true_counts)
    cov_pp = s * s - float(pred_counts @ pred_counts)
    cov_tt = s * s - float(true_counts @ true_counts)
    denom = math.sqrt(cov_pp * cov_tt)
    return 0.0 if denom == 0.0 else cov_pt / denom


def pearson(predictions: ArrayLike, labels: ArrayLike) -> float:
    """Pearson correlation; NaN if either side is constant."""
    p, y = _pair(predictions, labels)
    p, y = p.astype(np.float64), y.astype(np.float64)
    if p.size < 2 or np.ptp(p) == 0 or np.ptp(y) == 0:
        return float("nan")
    pc, yc = p - p.mean(), y - y.mean()
    r = float(pc @ yc / math.sqrt(float(pc @ pc) * float(yc @ yc)))
    return max(-1.0, min(1.0, r))


def spearman(predictions: ArrayLike, labels: ArrayLike) -> float:
    """Spearman rank correlation (Pearson of average ranks, ties averaged); NaN if either side is constant."""
    from scipy.stats import rankdata

    p, y = _pair(predictions, labels)
    return pearson(rankdata(p.astype(np.float64)), rankdata(y.astype(np.float64)))


METRIC_FUNCTIONS = {"accuracy": accuracy, "f1": f1, "matthews": matthews, "pearson": pearson, "spearman": spearman}


def predictions_from_outputs(task: GlueTask | str, outputs: ArrayLike) -> np.ndarray:
    """Turn model outputs into predictions: argmax of logits for classification, the score for STS-B.

    1-D input is taken as predictions already (class ids, or scores for STS-B).
    """
    task = get_task(task)
    out = np.asarray(outputs)
    if task.is_regression:
        return out.reshape(-1).astype(np.float64)
    if out.ndim == 2:
        return out.argmax(axis=-1)
    return out.reshape(-1)


def compute_metrics(
    task: GlueTask | str, predictions: ArrayLike, labels: ArrayLike, split: str | None = None
) -> dict[str, float]:
    """All SPEC §7 metrics of `task` on one dev split, keyed by metric name.

    `predictions` may be logits (n x classes), class ids, or STS-B scores. `split` names the dev split
    (default: the task's first); for MNLI's `validation_mismatched` the keys get `_mismatched`
    (`accuracy_mismatched`), so the dicts of both MNLI dev sets can simply be merged.
    """
    task = get_task(task)
    split = split or next(iter(task.dev_splits))
    if split not in task.dev_splits:
        raise PosprobeError(f"'{split}' is not a dev split of {task.name}", f"use one of: {', '.join(task.dev_splits)}")
    suffix = task.dev_splits[split]
    preds = predictions_from_outputs(task, predictions)
    return {name + suffix: METRIC_FUNCTIONS[name](preds, labels) for name in task.metrics}
