"""Needle-in-a-haystack scores and their summaries (SPEC §18), pure arrays in and out.

Per prompt, from the logits of one teacher-forced pass over prompt + answer: the answer's log-probability
`sum_i log p(a_i | prompt, a_<i)` (float64), and greedy exact match, which needs no generation: the greedy
continuation equals the answer exactly when every teacher-forced argmax equals the answer token (by induction on
the prefix), and up to the first token where they differ it *is* the teacher-forced argmax.

Summaries over the grid: arrays shaped (lengths, depths, trials[, layers, heads]); NaN marks a cell not run.
"""

from __future__ import annotations

import warnings

import numpy as np


def answer_scores(answer_logits, answer_ids) -> tuple[list[float], bool, list[int]]:
    """(per-token log-probabilities, exact match, greedy prefix) of an answer of A tokens from `answer_logits`
    (A, V), the logits at the last prompt position and the first A-1 answer positions; the answer's
    log-probability is the sum of the first. The greedy prefix is the teacher-forced argmax up to and including its
    first token that differs from the answer (all A when it matches)."""
    import torch

    logits = torch.as_tensor(answer_logits).double()
    targets = torch.as_tensor(list(answer_ids), dtype=torch.long, device=logits.device)
    token_log_probs = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0].tolist()
    greedy = logits.argmax(-1).tolist()
    wrong = [i for i, (g, t) in enumerate(zip(greedy, targets.tolist())) if g != t]
    prefix = greedy if not wrong else greedy[: wrong[0] + 1]
    return token_log_probs, not wrong, prefix


def cell_means(values: np.ndarray) -> np.ndarray:
    """(lengths, depths): the mean over trials (axis 2) of `values` (lengths, depths, trials), NaN cells left out."""
    values = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        counts = np.isfinite(values).sum(2)
        sums = np.where(np.isfinite(values), values, 0.0).sum(2)
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile: two-sided 95 % intervals


def wilson_interval(successes: np.ndarray, n: np.ndarray, z: float = Z95) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval (lower, upper) of a binomial proportion, elementwise: `successes` of `n` trials
    (arrays of one shape); NaN where n = 0. It stays inside [0, 1] and is not empty at 0 or n successes, where the
    normal interval collapses to a point."""
    k, n = np.asarray(successes, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low, high = np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)
    return np.where(n > 0, low, np.nan), np.where(n > 0, high, np.nan)


def cell_successes(exact: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(successes, trials) per cell (Lg, D) of greedy exact matches `exact` (Lg, D, T), NaN entries not counted."""
    values = np.asarray(exact, dtype=np.float64)
    seen = np.isfinite(values)
    return np.where(seen, values, 0.0).sum(-1), seen.sum(-1)


def position_gaps(curve: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Primacy and recency gaps of depth curves `curve` (lengths, depths), depths in increasing order: the first
    depth's value minus the mean of the middle depths (all but the first and last), and the last depth's value
    minus that mean (Liu et al. 2023, "Lost in the middle": both positive = a U-curve). NaN with fewer than 3
    depths."""
    curve = np.asarray(curve, dtype=np.float64)
    if curve.shape[1] < 3:
        nan = np.full(curve.shape[0], np.nan)
        return nan, nan.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a length whose middle depths were all NaN
        middle = np.nanmean(curve[:, 1:-1], axis=1)
    return curve[:, 0] - middle, curve[:, -1] - middle


def head_means(needle_attention: np.ndarray) -> np.ndarray:
    """(layers, heads): the mean over all prompts of the retrieval attention (lengths, depths, trials, L, H), over
    the prompts read in every head that some prompt has; NaN for a head no prompt has (a layer with fewer query
    heads, SPEC §9) and everywhere when no prompt was read."""
    attention = np.asarray(needle_attention, dtype=np.float64)
    flat = attention.reshape(-1, *attention.shape[-2:])
    present = np.isfinite(flat).any(axis=0)
    keep = np.isfinite(flat[:, present]).all(axis=1) if present.any() else np.zeros(len(flat), dtype=bool)
    if not keep.any():
        return np.full(attention.shape[-2:], np.nan)
    return np.where(present, flat[keep].mean(0), np.nan)


def ranked_heads(mean_attention: np.ndarray, top: int | None = None) -> list[tuple[int, int, float]]:
    """(layer, head, mean retrieval attention) of every head with a value (NaN: no such head, or no prompt read),
    the largest first (`top` of them)."""
    order = np.argsort(-np.nan_to_num(mean_attention, nan=-np.inf), axis=None, kind="stable")
    layers, heads = np.unravel_index(order, mean_attention.shape)
    rows = [(int(layer), int(head), float(mean_attention[layer, head])) for layer, head in zip(layers, heads)]
    rows = [row for row in rows if row[2] == row[2]]
    return rows if top is None else rows[:top]


def retrieval_hits(top_keys, key_ids, span: tuple[int, int], generated) -> np.ndarray:
    """(L, H) float64: Wu et al. 2024's copy count of one prompt, the steps at which a head retrieves.

    top_keys (L, H, S) ints: at each of the S decoding steps, the key each head attends most (-1: a head the layer
    lacks); key_ids (keys,): the token at each key position; span: the needle's keys [start, end); generated (S,):
    the token each step generates. A head scores at a step when its most-attended key lies in the needle and holds
    the generated token. The retrieval score is this count over the answer's length (`retrieval_score`)."""
    top = np.asarray(top_keys, dtype=np.int64)
    ids = np.asarray(key_ids, dtype=np.int64)
    new = np.asarray(generated, dtype=np.int64)[: top.shape[-1]]
    top = top[..., : len(new)]
    start, end = span
    inside = (top >= start) & (top < end)
    held = np.where(top >= 0, ids[np.clip(top, 0, len(ids) - 1)], -1)
    hits = (inside & (held == new[None, None, :])).sum(-1).astype(np.float64)
    return np.where((top < 0).all(-1) & (top.shape[-1] > 0), np.nan, hits)


def retrieval_score(hits: np.ndarray, answer_length: int) -> np.ndarray:
    """(L, H): a prompt's retrieval score, its copy count (`retrieval_hits`) over the answer's length in tokens."""
    return np.asarray(hits, dtype=np.float64) / max(1, int(answer_length))


def top_overlap(first: np.ndarray, second: np.ndarray, top: int = 10) -> int:
    """How many heads the top `top` of two (L, H) rankings share."""
    a = {(layer, head) for layer, head, _ in ranked_heads(first, top)}
    b = {(layer, head) for layer, head, _ in ranked_heads(second, top)}
    return len(a & b)
