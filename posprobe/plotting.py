"""Figures for the position analyses. Every function takes results and returns a matplotlib Figure;
only the output layer saves them.

matplotlib is imported lazily and without pyplot (no global figure state, no GUI backend). Matrices are
coloured once into 8-bit RGBA, block-averaged to about the panel's pixel size first, which keeps memory and
time low for 512 x 512 (or larger) matrices; numbers printed by posprobe always use the full matrix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from posprobe.analysis.toeplitz import format_r2

PANEL_PIXELS = 300  # display resolution of one grid panel; larger matrices are block-averaged to about this
FIGURE_DPI = 110  # the resolution posprobe.outputs.save_figure writes raster figures at


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))  # fixed margins: a layout engine would cost a second draw


def _grid(count: int) -> tuple[int, int]:
    cols = min(count, 4 if count <= 8 else 6)
    return math.ceil(count / cols), cols


def _robust_limits(matrix: np.ndarray) -> tuple[float, float]:
    """Colour limits at the 1st and 99th percentiles, so one outlying entry (often position 0) does not
    wash out the whole image."""
    lo, hi = np.percentile(matrix, [1, 99])
    return (float(lo), float(hi)) if hi > lo else (float(matrix.min()), float(matrix.max()) + 1e-12)


def _pool(matrix: np.ndarray, pixels: int = PANEL_PIXELS) -> np.ndarray:
    """Block-average an (n, n) matrix by the smallest integer factor that brings it to at most `pixels` wide."""
    factor = max(1, math.ceil(matrix.shape[0] / pixels))
    if factor == 1:
        return matrix
    n = (matrix.shape[0] // factor) * factor
    m = matrix[:n, :n]
    return m.reshape(n // factor, factor, n // factor, factor).mean(axis=(1, 3))


def _coloured(matrix: np.ndarray, cmap_name: str, pixels: int = PANEL_PIXELS):
    """`matrix` pooled to about `pixels` wide and coloured with robust limits: (RGBA uint8, norm, cmap)."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    lo, hi = _robust_limits(matrix)
    norm, cmap = Normalize(lo, hi), colormaps[cmap_name]
    return cmap(norm(_pool(matrix, pixels).astype(np.float32)), bytes=True), norm, cmap


def _matrix_panel(
    fig, ax, matrix: np.ndarray, cmap_name: str, colorbar: bool = False, pixels: int = PANEL_PIXELS
) -> None:
    """Draw `matrix` (row i down, column j right) with robust colour limits."""
    from matplotlib.cm import ScalarMappable

    rgba, norm, cmap = _coloured(matrix, cmap_name, pixels)
    n = matrix.shape[0]
    ax.imshow(rgba, interpolation="nearest", extent=(-0.5, n - 0.5, n - 0.5, -0.5))
    if colorbar:
        fig.colorbar(ScalarMappable(norm, cmap), ax=ax, fraction=0.046, pad=0.04)


def heatmap(result):
    """P = E_P E_P^T as an image, title with the Toeplitz R^2 (whole and leading blocks)."""
    fig = _figure(5.4, 4.8)
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.12, right=0.86, top=0.88, bottom=0.1)
    _matrix_panel(fig, ax, result.matrix, "Reds", colorbar=True, pixels=PANEL_PIXELS)
    kind = "cosine" if result.cosine else "inner product"
    blocks = "".join(f", first {b}: {format_r2(r, 3)}" for b, r in result.blocks.items())
    ax.set_title(
        f"{result.model}\nP = E_P E_Pᵀ ({kind}); Toeplitz R² = {format_r2(result.toeplitz_r2, 3)}{blocks}", fontsize=9
    )
    ax.set_xlabel("position j")
    ax.set_ylabel("position i")
    return fig


@dataclass(frozen=True)
class Mosaic:
    """A grid of coloured matrix panels as one RGBA image, with a title and one label per panel.

    `pixels` (height, width, 4) uint8; `labels` are (x, y, text) with (x, y) the pixel position of the
    bottom centre of the text. Rendered to PNG by Pillow (fast: no axes, no resampling) or, for vector
    formats, into a matplotlib Figure pixel for pixel.
    """

    pixels: np.ndarray
    title: str
    labels: tuple[tuple[float, float, str], ...]


def fhat_grid(result) -> Mosaic:
    """One F_hat_P image per head of a layer (paper Fig. 8), R^2 in each label; each head keeps its own
    robust colour scale. A dozen matplotlib axes would cost more to build and draw than the analysis."""
    rows, cols = _grid(result.n_heads)
    tiles = [_coloured(result.matrices[h], "viridis")[0] for h in range(result.n_heads)]
    size = tiles[0].shape[0]
    gap, top, header = 16, 22, 40  # pixels: between panels, above each panel (its label), above the grid
    pixels = np.full((rows * (size + top) + gap + header, cols * (size + gap) + gap, 4), 255, dtype=np.uint8)
    labels = []
    for h, tile in enumerate(tiles):
        r, c = divmod(h, cols)
        y, x = header + r * (size + top) + top, c * (size + gap) + gap
        pixels[y : y + size, x : x + size] = tile
        labels.append((x + size / 2, y - 4, f"head {h}: R² = {format_r2(result.toeplitz_r2[h], 3)}"))
    title = f"{result.model}: F̂_P, layer {result.layer}, {result.mode} mode (row i = query, column j = key)"
    return Mosaic(pixels, title, tuple(labels))


def render_mosaic_png(mosaic: Mosaic, path) -> None:
    """PNG through Pillow, with matplotlib's DejaVu Sans for the text (Pillow's own font if absent)."""
    from PIL import Image, ImageDraw

    image = Image.fromarray(mosaic.pixels, "RGBA")
    draw = ImageDraw.Draw(image)
    small, large = _font(11), _font(14)
    for x, y, text in mosaic.labels:
        draw.text((x, y), text, fill=(0, 0, 0, 255), font=small, anchor="mb")
    draw.text((mosaic.pixels.shape[1] / 2, 10), mosaic.title, fill=(0, 0, 0, 255), font=large, anchor="mt")
    image.convert("RGB").save(path, format="PNG", compress_level=3)


def mosaic_figure(mosaic: Mosaic, dpi: int = FIGURE_DPI):
    """The mosaic as a matplotlib Figure (for PDF/SVG), one image pixel per output pixel at `dpi`."""
    height, width = mosaic.pixels.shape[:2]
    fig = _figure(width / dpi, height / dpi)
    fig.set_dpi(dpi)
    fig.figimage(mosaic.pixels, xo=0, yo=0, origin="upper")
    for x, y, text in mosaic.labels:
        fig.text(x / width, 1 - y / height, text, ha="center", va="bottom", fontsize=8)
    fig.suptitle(mosaic.title, fontsize=10, y=1 - 10 / height, va="top")
    return fig


def _font(size: int):
    import importlib.util
    from pathlib import Path

    from PIL import ImageFont

    spec = importlib.util.find_spec("matplotlib")
    if spec and spec.submodule_search_locations:
        ttf = Path(list(spec.submodule_search_locations)[0]) / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
        if ttf.is_file():
            return ImageFont.truetype(str(ttf), size)
    return ImageFont.load_default(size)


def profile_grid(result, layer_index: int = 0):
    """Per head: sections of F_hat_P at 5 rows i (thin lines) and the profile (thick), over k = j - i.

    Paper Figs. 3, 6 and 7: when F_hat_P is near-Toeplitz the sections coincide with the profile.
    """
    w = result.window
    ks = np.arange(-w, w + 1)
    centre = result.n_positions - 1
    rows, cols = _grid(result.n_heads)
    fig = _figure(2.8 * cols, 2.2 * rows + 0.6)
    axes = fig.subplots(
        rows,
        cols,
        squeeze=False,
        gridspec_kw=dict(
            left=0.04,
            right=0.99,
            bottom=0.35 / fig.get_figheight(),
            top=1 - 0.55 / fig.get_figheight(),
            wspace=0.3,
            hspace=0.45,
        ),
    )
    for h, ax in enumerate(axes.flat):
        if h >= result.n_heads:
            ax.axis("off")
            continue
        for s, row in enumerate(result.section_rows):
            ax.plot(ks, result.sections[layer_index, h, s], lw=0.8, alpha=0.6, label=f"i = {row}")
        ax.plot(
            ks, result.profiles[layer_index, h, centre - w : centre + w + 1], color="black", lw=1.8, label="profile"
        )
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_title(f"head {h}", fontsize=8)
        ax.tick_params(labelsize=6)
    axes.flat[0].legend(fontsize=5, loc="best")
    layer = result.layers[layer_index]
    fig.suptitle(
        f"{result.model}: positional profiles, layer {layer}, {result.mode} mode (x: k = j − i, positive = later key)",
        fontsize=10,
    )
    return fig


def compare_heatmaps(rows):
    """Side-by-side P heatmaps of several models (paper Fig. 1)."""
    fig = _figure(3.6 * len(rows), 3.9)
    axes = fig.subplots(
        1, len(rows), squeeze=False, gridspec_kw=dict(left=0.02, right=0.98, bottom=0.02, top=0.85, wspace=0.08)
    )
    for row, ax in zip(rows, axes.flat):
        _matrix_panel(fig, ax, row.matrix, "Reds")
        ax.set_title(f"{row.model}\nR² = {format_r2(row.toeplitz_r2, 3)}", fontsize=9)
        ax.set_xticks([]), ax.set_yticks([])
    return fig
