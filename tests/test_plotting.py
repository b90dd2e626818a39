"""Figures: displayable in a notebook and saved as the CLI writes them; signed matrices on a diverging
scale centred on 0; the fit figure drawn at integer k only; one panel per model in `compare`."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from posprobe import plotting
from posprobe.pipelines.analysis import CompareRow, FhatResult, ToeplitzResult


def fhat_result(n_heads=6, n=40, seed=0) -> FhatResult:
    rng = np.random.default_rng(seed)
    mats = rng.normal(size=(n_heads, n, n))
    mats[2] *= 10.0  # one loud head
    return FhatResult("tiny", "bert", 0, 0, "paper", mats, np.linspace(0.1, 0.9, n_heads))


def not_blank(image: Image.Image) -> bool:
    pixels = np.asarray(image.convert("RGB"))
    return pixels.std() > 5 and (pixels < 128).any()


def test_fhat_grid_displays_and_saves_like_the_cli(tmp_path):
    from posprobe.outputs import save_figure

    mosaic = plotting.fhat_grid(fhat_result(n_heads=12))  # 2 rows of 6 columns
    png = Image.open(io.BytesIO(mosaic._repr_png_()))
    assert png.size == mosaic.size and not_blank(png)
    mosaic.savefig(tmp_path / "nb.png")
    save_figure(mosaic, tmp_path / "cli.png")
    assert (tmp_path / "nb.png").read_bytes() == (tmp_path / "cli.png").read_bytes()
    # the matplotlib Figure: at matplotlib's default savefig dpi nothing is cut and it is not blank
    fig = mosaic.figure()
    fig.savefig(tmp_path / "fig.png")
    saved = Image.open(tmp_path / "fig.png")
    assert saved.size == mosaic.size and not_blank(saved)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any(t.startswith("head 5:") for t in texts) and any(t.startswith("head 11:") for t in texts)
    label_x = max(x for x, _, text, _, _ in mosaic.labels if text.startswith("head 5:"))
    assert label_x < mosaic.size[0]  # the sixth column is inside the image
    for fmt in ("svg", "pdf"):
        mosaic.savefig(tmp_path / f"fig.{fmt}")
        assert (tmp_path / f"fig.{fmt}").stat().st_size > 1000


def test_fhat_grid_scales():
    result = fhat_result()
    shared = plotting.fhat_grid(result)
    per_head = plotting.fhat_grid(result, scale="per-head")
    assert "one colour scale" in shared.title and "each head its own" in per_head.title
    assert any("±" in label[2] for label in per_head.labels) and not any("±" in lab[2] for lab in shared.labels)
    assert shared.size[0] > per_head.size[0]  # the shared scale has a colorbar
    # axis labels on the outer panels only: 'query i' once per row, 'key j' once per column
    rows, cols = plotting._grid(6)
    assert sum(lab[2] == "query i" for lab in shared.labels) == rows
    assert sum(lab[2] == "key j" for lab in shared.labels) == cols
    with pytest.raises(ValueError):
        plotting.fhat_grid(result, scale="nope")


def test_diverging_scale_is_centred_on_zero():
    """Zero maps to the colormap's middle (white-ish) whatever the matrix's range."""
    m = np.array([[0.0, 5.0], [-1.0, 0.0]])
    rgba, norm, _ = plotting._coloured(m, plotting._symmetric_limit(m))
    assert norm.vmin == -norm.vmax and norm(0.0) == pytest.approx(0.5)
    assert rgba[0, 0, :3].min() > 230  # white at 0
    assert rgba[0, 1, 0] > rgba[0, 1, 2] and rgba[1, 0, 2] > rgba[1, 0, 0]  # red > 0, blue < 0


def test_heatmap_and_compare_are_figures_with_colorbars(tmp_path):
    rng = np.random.default_rng(1)
    m = rng.normal(size=(30, 30))
    t = ToeplitzResult("a/very/long/path/model", "bert", 30, 0, False, m, 0.5, {16: None})
    fig = plotting.heatmap(t)
    assert len(fig.axes) == 2 and "undefined" in fig.axes[0].get_title()  # image + colorbar
    rows = [CompareRow(f"/runs/{x}/model", "model", 30, 0.4, None, 0.5, m) for x in "ab"]
    fig = plotting.compare_heatmaps(rows, ["model (a)", "model (b)"])
    images = [ax for ax in fig.axes if ax.images]
    assert len(images) == 2 and len(fig.axes) == 4  # one panel per model (no blank one) + a colorbar each
    assert [ax.get_title().splitlines()[0] for ax in images] == ["model (a)", "model (b)"]
    fig.savefig(tmp_path / "c.png")
    assert not_blank(Image.open(tmp_path / "c.png"))


def test_fit_figure_draws_the_fit_at_integer_k_only():
    """A needle kernel (b = 10) between integers must not draw a spike: the fit line's x values are the
    panel positions of the integer offsets, and its heights are f(k) at those integers."""
    from posprobe.analysis.tisa_fit import tisa_function
    from posprobe.plotting_fit import tisa_fit_grid

    w = 4
    k = np.arange(-10, 11)
    a, b, c = np.array([[[3.0]]]), np.array([[[10.0]]]), np.array([[[0.5]]])  # peak between k = 0 and 1
    profiles = tisa_function(k, a, b, c)  # (1, 1, K)
    fig = tisa_fit_grid(k, profiles, a, b, c, np.zeros((1, 1)), np.ones((1, 1)), [0], w)
    (ax,) = fig.axes
    fit_line = next(line for line in ax.lines if line.get_label().startswith("TISA fit"))
    x = fit_line.get_xdata()
    x = x[np.isfinite(x)]
    assert x.size == 2 * w + 1  # one point per integer k in -W..W, nothing in between
    y = fit_line.get_ydata()
    y = y[np.isfinite(y)]
    at_integers = tisa_function(np.arange(-w, w + 1), a[0, 0], b[0, 0], c[0, 0])
    # heights are an affine image of f at the integers (the panel's own vertical scale)
    assert np.corrcoef(y, at_integers)[0, 1] == pytest.approx(1.0)


def test_fit_figure_cost_is_linear_in_panels():
    """Twice the panels must not cost four times as much (shared axes made it quadratic)."""
    import time

    from posprobe.plotting_fit import tisa_fit_grid

    k = np.arange(-20, 21)

    def draw(n_layers: int) -> float:
        rng = np.random.default_rng(0)
        shape = (n_layers, 12)
        profiles = rng.normal(size=shape + (k.size,))
        a, b, c = rng.normal(size=shape + (3,)), np.ones(shape + (3,)), rng.normal(size=shape + (3,))
        start = time.perf_counter()
        fig = tisa_fit_grid(k, profiles, a, b, c, np.zeros(shape), np.ones(shape), list(range(n_layers)), 16)
        assert len(fig.axes) == 1  # all panels in one Axes
        return time.perf_counter() - start

    draw(1)
    small, large = min(draw(4) for _ in range(2)), min(draw(16) for _ in range(2))
    assert large < 8 * small + 0.5  # 4x the panels; quadratic would be ~16x
