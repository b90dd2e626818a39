"""Figures of `posprobe attention` (posprobe/plotting/attention.py): a causal model's profile pages show only the
offsets it has (k <= 0), one legend per page names the weights-based profile, and the heads x layers charts keep
fixed margins in inches (a 30-layer chart has no wide empty bands) with the numbers of the result in their cells."""

from __future__ import annotations

import numpy as np
import pytest
from test_attention import sequences, tiny_model

from posprobe.pipelines.attention import attention_profiles
from posprobe.plotting import attention as plotting_attention


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A causal result with weights-based profiles (tiny Llama from a folder) and a bidirectional one (tiny BERT)."""
    folder = tmp_path_factory.mktemp("llama") / "llama"
    tiny_model("llama").save_pretrained(folder)
    causal = attention_profiles(str(folder), input_ids=sequences(6), max_length=12, min_pairs=1, verify=False)
    both = attention_profiles(tiny_model("bert"), input_ids=sequences(6), max_length=12, verify=False)
    return causal, both


def test_causal_profile_page_shows_only_the_offsets_the_model_has(results):
    causal, both = results
    assert causal.causal and not both.causal
    pages = plotting_attention.attention_pages(causal, window=8)
    assert pages.ks.min() == -8 and pages.ks.max() == 0
    assert "causal: no pairs at k > 0" in pages.page_titles[1]
    pages = plotting_attention.attention_pages(both, window=8)
    assert pages.ks.min() == -8 and pages.ks.max() == 8 and "causal" not in pages.page_titles[1]


def test_profile_page_has_one_legend_naming_every_line(results):
    causal, both = results
    assert causal.weights_profiles is not None and both.weights_profiles is None
    fig = plotting_attention.profile_grid(causal, 0)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[:3] == [
        "mean score s(k) (left scale)",
        "mean probability a(k) (right scale)",
        "a(k) without key 0 / query 0 (right scale)",
    ]
    assert labels[3].startswith("weights-based profile")
    fig = plotting_attention.profile_grid(both, 0)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert len(fig.axes) == 1 and not any(x.startswith("weights-based") for x in labels)
    assert labels[3] == "fewer than 100 pairs (not in r)"  # 6 short texts: every offset has fewer than 100 pairs


def test_offsets_with_few_pairs_are_shaded_and_each_panel_states_its_span(results):
    """Issue 38 item 10: the offsets r leaves out (fewer than --min-pairs pairs) are shaded, and each panel says
    how much its own-scaled profile spans."""
    causal, both = results
    pages = plotting_attention.attention_pages(both, window=8)
    n = both.max_length
    np.testing.assert_array_equal(pages.sparse, both.profiles.pair_counts[:, n - 9 : n + 8] < both.min_pairs)
    pages.figure(1)
    assert len(pages._sparse.get_paths()) >= 1
    s = both.profiles.score_profiles[1, 0, n - 9 : n + 8]
    assert pages._span[0].get_text() == f"Δ {np.ptp(s[np.isfinite(s)]):.2g}"
    assert plotting_attention.attention_pages(causal, window=8).sparse is None  # min_pairs 1: nothing to shade


def test_profile_pages_carry_each_layers_numbers(results):
    """Page p holds layer p's s(k), a(k) and panel titles (distance, r), each head on its own scales."""
    causal, _ = results
    pages = plotting_attention.attention_pages(causal, window=8)
    n = causal.max_length
    np.testing.assert_array_equal(pages.profiles[1], causal.profiles.score_profiles[1, :, n - 9 : n])
    np.testing.assert_array_equal(pages.overlays[1], causal.profiles.prob_profiles[1, :, n - 9 : n])
    assert pages.panel_titles[1][2].startswith(f"head 2: dist {causal.profiles.mean_distance[1, 2]:.2f}")
    pages.figure(1)
    assert pages._panel_title[2].get_text() == pages.panel_titles[1][2]
    assert float(pages._overlay_scale[0].get_text()) > float(pages._overlay_scale[1].get_text())


@pytest.mark.slow
def test_attention_pages_png_equals_the_figure(results, tmp_path):
    """The fast path (kept background, changing artists redrawn) draws what the plain Figure draws, page by page."""
    from PIL import Image

    causal, _ = results
    pages = plotting_attention.attention_pages(causal, window=8)
    for page in (1, 0):
        pages.write(page, tmp_path / f"fast{page}.png")
    for page in range(2):
        plotting_attention.attention_pages(causal, window=8).figure(page).savefig(tmp_path / f"slow{page}.png", dpi=110)
        fast = np.asarray(Image.open(tmp_path / f"fast{page}.png").convert("RGB"), dtype=np.int16)
        slow = np.asarray(Image.open(tmp_path / f"slow{page}.png").convert("RGB"), dtype=np.int16)
        assert fast.shape == slow.shape and np.mean(np.abs(fast - slow) > 8) < 0.002


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
