"""Figures of `posprobe attention` (posprobe/plotting_attention.py): a causal model's profile pages show only the
offsets it has (k <= 0), one legend per page names the weights-based profile, and the heads x layers charts keep
fixed margins in inches (a 30-layer chart has no wide empty bands) with the numbers of the result in their cells."""

from __future__ import annotations

import numpy as np
import pytest
from test_attention import sequences, tiny_model

from posprobe import plotting_attention
from posprobe.pipelines.attention import attention_profiles


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A causal result with weights-based profiles (tiny Llama from a folder) and a bidirectional one (tiny BERT)."""
    folder = tmp_path_factory.mktemp("llama") / "llama"
    tiny_model("llama").save_pretrained(folder)
    causal = attention_profiles(str(folder), input_ids=sequences(6), max_length=12, min_pairs=1, verify=False)
    both = attention_profiles(tiny_model("bert"), input_ids=sequences(6), max_length=12, verify=False)
    return causal, both


def _data_x(fig) -> np.ndarray:
    return np.concatenate([line.get_xdata() for ax in fig.axes for line in ax.get_lines() if len(line.get_xdata())])


def test_causal_profile_page_shows_only_the_offsets_the_model_has(results):
    causal, both = results
    assert causal.causal and not both.causal
    fig = plotting_attention.profile_grid(causal, 1, window=8)
    x = _data_x(fig)
    assert x.max() == 0 and x.min() == -8
    assert all(ax.get_xlim()[1] <= 0.5 for ax in fig.axes if ax.get_lines())
    assert "causal: no pairs at k > 0" in fig._suptitle.get_text()
    fig = plotting_attention.profile_grid(both, 1, window=8)
    assert _data_x(fig).max() == 8 and "causal" not in fig._suptitle.get_text()


def test_profile_page_has_one_legend_naming_every_line(results):
    causal, both = results
    assert causal.weights_profiles is not None and both.weights_profiles is None
    labels = [t.get_text() for t in plotting_attention.profile_grid(causal, 0).legends[0].get_texts()]
    assert labels[:2] == ["mean score s(k) (left axis)", "mean probability a(k) (right axis)"]
    assert labels[2].startswith("weights-based profile")
    fig = plotting_attention.profile_grid(both, 0)
    assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) == 2  # no weights-based line drawn
    assert not any(ax.get_legend() for ax in fig.axes)  # none inside a panel, over the data


@pytest.mark.parametrize("chart", ["mean_distance_chart", "sink_chart"])
def test_heatmap_charts_keep_margins_in_inches(results, chart):
    causal, _ = results
    fig = getattr(plotting_attention, chart)(causal)
    width = fig.get_figwidth()
    heat = next(ax for ax in fig.axes if ax.get_images())
    bar = max(fig.axes, key=lambda ax: ax.get_position().x0)
    assert heat.get_position().x0 * width == pytest.approx(0.6)
    assert (1 - heat.get_position().x1) * width == pytest.approx(1.0)
    assert heat.get_position().x1 < bar.get_position().x0 and bar.get_position().x1 < 1
    values = causal.mean_distance if chart == "mean_distance_chart" else causal.sinks.first_token_mass
    cells = sorted(t.get_text() for t in heat.texts)
    assert cells == sorted(f"{v:.2f}" for v in values.ravel())  # heads x layers, each value once


def test_uniform_reference_is_written_once_when_every_layer_has_the_same(results):
    causal, _ = results
    uniform = causal.sinks.uniform_distance
    assert np.ptp(uniform) == 0  # a causal mask without windows: the same keys in every layer
    ax = next(ax for ax in plotting_attention.mean_distance_chart(causal).axes if ax.get_images())
    assert f"uniform attention would give {uniform[0]:.2f} in every layer" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(layer) for layer in range(causal.n_layers)]
