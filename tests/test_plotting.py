"""Figures: displayable in a notebook and saved as the CLI writes them; signed matrices on a diverging
scale centred on 0; the fit figure drawn at integer k only; one panel per model in `compare`."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from posprobe.pipelines.weights import CompareRow, FhatResult, ToeplitzResult
from posprobe.plotting import base as plotting


def fhat_result(n_heads=6, n=40, seed=0) -> FhatResult:
    rng = np.random.default_rng(seed)
    mats = rng.normal(size=(n_heads, n, n))
    mats[2] *= 10.0  # one loud head
    return FhatResult("tiny", "bert", 0, 0, "paper", mats, np.linspace(0.1, 0.9, n_heads))


def not_blank(image: Image.Image) -> bool:
    pixels = np.asarray(image.convert("RGB"))
    return pixels.std() > 5 and (pixels < 128).any()


@pytest.mark.slow
def test_fhat_grid_displays_and_saves_like_the_cli(tmp_path):
    from posprobe.formats.writing import save_figure

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
    shared = plotting.fhat_grid(result, scale="shared")
    per_head = plotting.fhat_grid(result)  # the default
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
    for ax in images:  # ticks at the first and last position, axes named
        assert list(ax.get_xticks()) == [0, 29] and ax.get_xlabel() == "position j" and ax.get_ylabel()
        assert not ax.patches  # P is symmetric and used whole: nothing shaded


def test_compare_shades_what_a_causal_model_never_uses():
    """A causal model's panel (its head-mean layer-0 scores) shades k = j - i > 0, as `profiles` does, and says so;
    the shaded triangle is exactly the region above the diagonal."""
    m = np.random.default_rng(2).normal(size=(12, 12))
    rows = [
        CompareRow("gpt", "gpt", 12, None, None, 0.5, m, position_kind="rotary", causal=True, has_table=False),
        CompareRow("bert", "bert", 12, 0.4, None, 0.5, m),
    ]
    fig = plotting.compare_heatmaps(rows)
    causal, table = [ax for ax in fig.axes if ax.images]
    assert "k > 0 shaded" in causal.get_title() and causal.get_xlabel() == "key j" and len(causal.patches) == 1
    corners = causal.patches[0].get_xy()[:3].tolist()
    assert corners == [[-0.5, -0.5], [11.5, -0.5], [11.5, 11.5]]  # row i (down) < column j: k > 0
    assert not table.patches and "shaded" not in table.get_title()


def test_fit_figure_draws_the_fit_at_integer_k_only():
    """A needle kernel (b = 10) between integers must not draw a spike: the fit line's x values are the
    panel positions of the integer offsets, and its heights are f(k) at those integers."""
    from posprobe.analysis.tisa_fit import tisa_function
    from posprobe.plotting.fit import tisa_fit_grid

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

    from posprobe.plotting.fit import tisa_fit_grid

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


@pytest.mark.parametrize("n_heads", [3, 4, 9, 12])
def test_fhat_grid_is_sized_by_its_panels_not_by_n(n_heads):
    """Issue 19: `fhat --positions 64` gave a 644 x 246 px grid with clipped titles and overlapping labels. The
    panels are about the same size for any n, every label fits its cell, and the title fits the image."""
    from posprobe.plotting.base import LABEL_SIZE, TITLE_SIZE, _font

    sizes = {}
    for n in (16, 64, 512):
        mosaic = plotting.fhat_grid(fhat_result(n_heads=n_heads, n=n))
        sizes[n] = mosaic.size
        width = mosaic.size[0]
        rows: dict[float, list[tuple[float, float]]] = {}  # head labels by row: their horizontal extents
        for x, y, text, _, _ in mosaic.labels:
            if text.startswith("head "):
                half = _font(LABEL_SIZE).getlength(text) / 2
                rows.setdefault(y, []).append((x - half, x + half))
        assert sum(len(spans) for spans in rows.values()) == n_heads
        for spans in rows.values():
            spans.sort()
            assert all(hi <= lo for (_, hi), (lo, _) in zip(spans, spans[1:]))  # no two labels overlap
            assert spans[0][0] >= 0 and spans[-1][1] <= width
        assert max(_font(TITLE_SIZE).getlength(line) for line in mosaic.title.split("\n")) <= width
        tile = plotting.tile_pixels(n, n_heads)
        assert 150 <= tile <= 400  # the panel's side, whatever n
    widths = [w for w, _ in sizes.values()]
    assert max(widths) - min(widths) <= 0.25 * max(widths)


def test_profile_pages_are_sized_by_their_panels_and_texts(tmp_path):
    from posprobe.plotting.profiles import ProfilePages

    sizes = []
    for n in (16, 64, 512):
        k = np.arange(-min(20, n - 1), min(20, n - 1) + 1)
        profiles = np.sin(k / 3.0)[None, None].repeat(9, 1)
        pages = ProfilePages(k, profiles, None, (), ["model\npositional profiles, layer 0"], causal=True)
        pages.write(0, tmp_path / f"p{n}.png")
        image = Image.open(tmp_path / f"p{n}.png")
        assert not_blank(image)
        sizes.append(image.size)
    assert len(set(sizes)) == 1  # n does not change the page
    long_title = "x" * 300
    narrow = ProfilePages(np.arange(-3, 4), np.zeros((1, 1, 7)), None, (), [long_title])
    assert narrow.width * 110 >= __import__("posprobe.plotting.base", fromlist=["_font"])._font(15).getlength(
        long_title
    )


def test_profile_pages_png_equals_the_figure(tmp_path):
    """The fast path (a kept background plus the changing artists) draws what the plain Figure draws."""
    from posprobe.plotting.profiles import ProfilePages

    rng = np.random.default_rng(0)
    k = np.arange(-8, 9)
    profiles = rng.normal(size=(3, 5, k.size)).cumsum(-1)
    sections = profiles[:, :, None] + 0.1 * rng.normal(size=(3, 5, 2, k.size))
    args = (k, profiles, sections, ["i = 0", "i = 9"], [f"m\nlayer {p}" for p in range(3)])
    pages = ProfilePages(*args, causal=True)
    for page in (0, 2, 1):
        pages.write(page, tmp_path / f"fast{page}.png")
    for page in range(3):
        ProfilePages(*args, causal=True).figure(page).savefig(tmp_path / f"slow{page}.png", dpi=110)
        fast = np.asarray(Image.open(tmp_path / f"fast{page}.png").convert("RGB"), dtype=np.int16)
        slow = np.asarray(Image.open(tmp_path / f"slow{page}.png").convert("RGB"), dtype=np.int16)
        assert fast.shape == slow.shape and np.mean(np.abs(fast - slow) > 8) < 0.002


@pytest.mark.parametrize("by_construction", [True, False])
def test_profile_pages_draw_no_sections_where_they_equal_the_profile(by_construction):
    """Toeplitz by construction: every section equals the profile, so none is drawn nor listed in the legend (the
    legend named five lines hidden under the profile); otherwise the sections are drawn and listed."""
    from types import SimpleNamespace

    from posprobe.plotting.profiles import profile_pages

    n, w = 6, 3
    profiles = np.arange(2 * (2 * n - 1), dtype=float).reshape(1, 2, 2 * n - 1)
    sections = profiles[:, :, None, n - 1 - w : n + w].repeat(2, 2)  # (L, H, R, 2w + 1)
    result = SimpleNamespace(window=w, n_positions=n, profiles=profiles, sections=sections, section_rows=[0, 5],
                             layers=[0], model="m", mode="content-free", causal=True, quantization=None,
                             toeplitz_by_construction=by_construction, layer_kinds=None)  # fmt: skip
    pages = profile_pages(result)
    legend = [t.get_text() for t in pages.ax.get_legend().get_texts()]
    if by_construction:
        assert pages.sections is None and legend == ["profile", "k > 0: never used (causal)"]
        assert "Toeplitz by construction (every section equals the profile)" in pages.page_titles[0]
    else:
        assert pages.sections.shape == (1, 2, 2, 2 * w + 1) and legend[1:3] == ["i = 0", "i = 5"]
