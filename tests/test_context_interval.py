"""Perplexity with an interval over windows and the context figures (issue 49): the interval against a naive
per-window loop and Student's t on the windows' mean losses (scipy, here); the loss figure's own linear panel past the
trained length; '1 window', not '1 windows'."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from test_context import cut_windows, documents, tiny_llama

import posprobe
from posprobe.analysis.context_loss import perplexity_interval


def test_interval_of_equal_windows_is_students_t_on_their_mean_losses():
    rng = np.random.default_rng(0)
    counts = np.full(6, 40)
    means = rng.normal(3.0, 0.2, size=6)
    low, high = perplexity_interval(means * counts, counts)
    lo, hi = stats.t.interval(0.95, 5, loc=means.mean(), scale=stats.sem(means))
    assert low == pytest.approx(math.exp(lo), rel=1e-12) and high == pytest.approx(math.exp(hi), rel=1e-12)
    assert all(math.isnan(x) for x in perplexity_interval([5.0], [2]))  # one window: no interval
    assert all(math.isnan(x) for x in perplexity_interval([5.0, 0.0], [2, 0]))  # a window that scored nothing


def test_context_interval_equals_a_naive_loop_over_windows():
    """Each window's summed loss from its own forward pass (a BOS first, one length: every window scores its
    tokens 1..L-1), the interval from those by the ratio estimator written out here."""
    model, docs, length, count = tiny_llama(), documents(), 12, 4
    result = posprobe.context(model, [length], documents=docs, windows=count, bos_id=2)
    stream = [x for i, d in enumerate(docs) for x in ([3] if i else []) + d]
    windows = cut_windows(stream, length, count, bos_id=2)
    sums = []
    with torch.no_grad():
        for ids in windows:
            logits = model(torch.as_tensor(ids)[None]).logits[0, :-1].double()
            sums.append(float(-torch.log_softmax(logits, -1).gather(-1, torch.as_tensor(ids[1:])[:, None]).sum()))
    sums, c = np.array(sums), length - 1
    mean = sums.sum() / (count * c)
    se = math.sqrt(count / (count - 1) * ((sums - mean * c) ** 2).sum()) / (count * c)
    half = stats.t.ppf(0.975, count - 1) * se
    np.testing.assert_allclose(result.perplexity_interval[0, 0], np.exp([mean - half, mean + half]), rtol=1e-5)
    record = result.to_dict()
    low, high = record["perplexity_interval"]["none"][str(length)]
    assert low < record["perplexity"]["none"][str(length)] < high


def test_loss_figure_has_a_linear_panel_past_the_trained_length_and_says_1_window():
    model, docs = tiny_llama(max_positions=32), documents(60)
    result = posprobe.context(model, [16, 48], documents=docs, windows=1, bos_id=2)
    assert result.trained_length == 32 and result.windows.tolist()[-1] == 1
    fig = result.plot()
    log_axis, linear = fig.axes
    assert log_axis.get_xscale() == "log" and linear.get_xscale() == "linear"
    assert linear.get_xlim()[0] <= 32 <= linear.get_xlim()[1] and linear.get_xlim()[1] == pytest.approx(48)
    assert "past the trained length (32), linear axis" in linear.get_title()
    title = fig._suptitle.get_text()
    assert "1 window of 48 tokens" in title and "1 windows" not in title
    within = posprobe.context(model, [16], documents=docs, windows=2, bos_id=2).plot()
    assert len(within.axes) == 1  # no region past the trained length: one panel
    words = result.plot_perplexity()._suptitle.get_text()
    assert "1 window of 48" in words and "1 windows" not in words
