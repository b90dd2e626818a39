"""Figures for the position analyses. Every function takes results and returns something a notebook
displays and that saves as the CLI writes it: a matplotlib Figure (`fig.savefig(path)`), or for the F̂_P
grid a `Mosaic` (`_repr_png_`, `.savefig(path)`, `.figure()`). Only the output layer writes files.

Signed matrices (P, F̂_P) use a diverging colormap centred on 0 (blue < 0 < red) with a colorbar.

matplotlib is imported lazily and without pyplot (no global figure state, no GUI backend). Matrices are
coloured once into 8-bit RGBA, block-averaged to about the panel's pixel size first, which keeps memory and
time low for 512 x 512 (or larger) matrices; numbers printed by posprobe always use the full matrix.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from posprobe.analysis.toeplitz import format_r2

PANEL_PIXELS = 300  # display resolution of a matrix panel; larger matrices are block-averaged to about this
TILE_PIXELS = 256  # side of one F_hat_P grid panel (of up to 16 panels): whatever n, see `tile_pixels`
TITLE_SIZE, TITLE_LINE, LABEL_SIZE = 14, 19, 11  # font sizes and the title's line height, in pixels
FIGURE_DPI = 110  # the resolution posprobe.formats.writing.save_figure writes raster figures at


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    # dpi = what the CLI writes at, so `fig.savefig(path)` in a notebook gives the CLI's file.
    # Fixed margins: a layout engine would cost a second draw.
    return Figure(figsize=(width, height), dpi=FIGURE_DPI)


def _grid(count: int) -> tuple[int, int]:
    cols = min(count, 4 if count <= 8 else 6)
    return math.ceil(count / cols), cols


DIVERGING = "RdBu_r"  # signed matrices (P, F_hat_P): blue < 0 < red, white at 0


def _symmetric_limit(*matrices: np.ndarray) -> float:
    """Colour limit v for a diverging scale [-v, v] centred on 0: the 99th percentile of |entries| over all
    `matrices` (so one outlying entry, often position 0, does not wash out the image); never 0."""
    values = np.concatenate([np.abs(np.asarray(m, dtype=np.float64)).ravel() for m in matrices])
    finite = values[np.isfinite(values)]
    v = float(np.percentile(finite, 99)) if finite.size else 1.0
    if not v > 0:
        v = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    return v


def _pool(matrix: np.ndarray, pixels: int = PANEL_PIXELS) -> np.ndarray:
    """Block-average an (n, n) matrix by the smallest integer factor that brings it to at most `pixels` wide."""
    factor = max(1, math.ceil(matrix.shape[0] / pixels))
    if factor == 1:
        return matrix
    n = (matrix.shape[0] // factor) * factor
    m = matrix[:n, :n]
    return m.reshape(n // factor, factor, n // factor, factor).mean(axis=(1, 3))


def _coloured(matrix: np.ndarray, limit: float, pixels: int = PANEL_PIXELS, cmap_name: str = DIVERGING):
    """`matrix` pooled to about `pixels` wide and coloured on [-limit, limit]: (RGBA uint8, norm, cmap)."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    norm, cmap = Normalize(-limit, limit), colormaps[cmap_name]
    return cmap(norm(_pool(matrix, pixels).astype(np.float32)), bytes=True), norm, cmap


def _matrix_panel(fig, ax, matrix: np.ndarray, limit: float, colorbar: bool = True, label: str = "") -> None:
    """Draw a signed `matrix` (row i down, column j right) on a diverging scale [-limit, limit]."""
    from matplotlib.cm import ScalarMappable

    rgba, norm, cmap = _coloured(matrix, limit)
    n = matrix.shape[0]
    ax.imshow(rgba, interpolation="nearest", extent=(-0.5, n - 0.5, n - 0.5, -0.5))
    if colorbar:
        bar = fig.colorbar(ScalarMappable(norm, cmap), ax=ax, fraction=0.046, pad=0.04)
        bar.ax.tick_params(labelsize=7)
        if label:
            bar.set_label(label, fontsize=8)


def heatmap(result):
    """P = E_P E_P^T as an image on a diverging scale centred on 0 with a colorbar; title with the Toeplitz
    R^2 (whole and leading blocks). Returns a matplotlib Figure."""
    fig = _figure(5.6, 4.8)
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.13, right=0.86, top=0.86, bottom=0.1)
    kind = "cosine" if result.cosine else "inner product"
    limit = 1.0 if result.cosine else _symmetric_limit(result.matrix)
    _matrix_panel(fig, ax, result.matrix, limit, label="cosine" if result.cosine else "⟨e_i, e_j⟩")
    blocks = "".join(f", first {b}: {format_r2(r, 3)}" for b, r in result.blocks.items())
    ax.set_title(
        f"{result.model}{quantization_note(result)}\nP = E_P E_Pᵀ ({kind}); "
        f"Toeplitz R² = {format_r2(result.toeplitz_r2, 3)}{blocks}",
        fontsize=9,
    )
    ax.set_xlabel("position j")
    ax.set_ylabel("position i")
    return fig


@dataclass(frozen=True)
class Mosaic:
    """A grid of coloured matrix panels as one RGBA image, with its texts: what `fhat_grid` returns.

    `pixels` (height, width, 4) uint8; `labels` are (x, y, text, anchor, size): pixel position, Pillow
    anchor ('mb' = middle-bottom, 'rm' = right-middle, ...) and font size in pixels; `title` is drawn
    centred at the top. Displays in a notebook (`_repr_png_`) and saves with `savefig(path)` exactly as
    the CLI writes it: PNG through Pillow (fast: no axes, no resampling), PDF/SVG through `figure()`.
    """

    pixels: np.ndarray
    title: str
    labels: tuple[tuple[float, float, str, str, int], ...]

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return self.pixels.shape[1], self.pixels.shape[0]

    def image(self):
        """The mosaic with its texts as a Pillow RGB image."""
        return render_mosaic_image(self)

    def _repr_png_(self) -> bytes:
        import io

        buffer = io.BytesIO()
        self.image().save(buffer, format="PNG", compress_level=3)
        return buffer.getvalue()

    def figure(self, dpi: int = FIGURE_DPI):
        """The mosaic as a matplotlib Figure (see `mosaic_figure`)."""
        return mosaic_figure(self, dpi)

    def savefig(self, path, format: str | None = None) -> None:  # noqa: A002 - matplotlib's name
        """Write to `path` (png, pdf or svg, from `format` or the suffix), as `posprobe fhat` does."""
        from pathlib import Path

        fmt = (format or Path(path).suffix.lstrip(".") or "png").lower()
        if fmt == "png":
            self.image().save(path, format="PNG", compress_level=3)
        else:
            self.figure().savefig(path, format=fmt, dpi=FIGURE_DPI)


def tile_pixels(n: int, panels: int) -> int:
    """Side in pixels of one matrix panel of an F_hat_P grid: set by the number of panels (about TILE_PIXELS, less
    for many), never by n alone: an n x n matrix is block-averaged (large n) or each entry drawn as a square block
    of pixels (small n), by a whole factor."""
    target = TILE_PIXELS if panels <= 16 else TILE_PIXELS * 3 // 4
    if n >= target:
        return n // math.ceil(n / (1.5 * target))
    return n * max(1, round(target / n))


def _tile(matrix: np.ndarray, limit: float, size: int) -> np.ndarray:
    """`matrix` (n, n) coloured on [-limit, limit] as a (size, size, 4) uint8 tile (see `tile_pixels`)."""
    n = matrix.shape[0]
    if size >= n:
        rgba = _coloured(matrix, limit, pixels=n)[0]
        factor = size // n
        return np.repeat(np.repeat(rgba, factor, axis=0), factor, axis=1)
    return _coloured(matrix, limit, pixels=size)[0]


def fhat_grid(result, scale: str = "per-head") -> Mosaic:
    """One F_hat_P image per head of a layer (paper Fig. 8) on a diverging scale centred on 0; R^2 in each
    label (none where the result is Toeplitz by construction: the title says so). `scale='per-head'` (default):
    each head its own symmetric scale, its limit written in its label — on a shared scale one head with large
    scores (MiniLM's layer 0) left ten of twelve panels looking empty; `'shared'`: one colour scale for every
    head, so their sizes can be compared, with one colorbar. The title says which scale the figure uses.

    Axis labels (query i down, key j across, 0 and n-1) on the outer panels only. Panels are about TILE_PIXELS
    wide whatever n (`tile_pixels`), cells and the whole image wide enough for their texts. Returns a `Mosaic`
    (displays in a notebook, `.savefig(path)`); a dozen matplotlib axes would cost more to build and
    draw than the analysis."""
    if scale not in ("shared", "per-head"):
        raise ValueError(f"scale must be 'shared' or 'per-head', got {scale!r}")
    from matplotlib import colormaps

    from posprobe.analysis.fhat import present_heads

    rows, cols = _grid(result.n_heads)
    n = result.matrices.shape[-1]
    by_construction = getattr(result, "toeplitz_by_construction", False)
    shared = _symmetric_limit(*result.matrices) if scale == "shared" else None
    limits = [shared if shared is not None else _symmetric_limit(m) for m in result.matrices]
    size = tile_pixels(n, result.n_heads)
    tiles = [_tile(result.matrices[h], limits[h], size) for h in range(result.n_heads)]
    names = []
    present = present_heads(result.matrices, 2)
    for h in range(result.n_heads):
        extra = f" (±{limits[h]:.3g})" if shared is None else ""
        stat = "" if by_construction else f": R² = {format_r2(result.toeplitz_r2[h], 3)}"
        names.append(f"head {h}{stat}{extra}" if present[h] else f"head {h}: no such head")  # SPEC §9
    label_font = _font(LABEL_SIZE)
    cell = max(size, math.ceil(max(label_font.getlength(name) for name in names)) + 6)  # a label fits its cell
    scale_note = "one colour scale for all heads" if shared is not None else "each head its own colour scale: ±limit"
    notes = causal_note(result) + ("; Toeplitz by construction" if by_construction else "")
    kind = layer_kind_note(getattr(result, "layer_kind", None))
    title = f"{result.model}{quantization_note(result)}\nF̂_P, layer {result.layer}{kind}, {result.mode} mode"
    title += f"{conditioning_note(result)} "
    title += f"({scale_note}){notes}"
    title_font = _font(TITLE_SIZE)
    title_w = max(title_font.getlength(line) for line in title.split("\n"))
    gap, top, left, bottom = 16, 22, 64, 34  # pixels
    header = 16 + TITLE_LINE * title.count("\n") + TITLE_LINE
    bar_w = 100 if shared is not None else 0  # colorbar strip plus its tick labels
    height = header + rows * (size + top) + bottom
    grid_w = left + cols * (cell + gap) + bar_w
    width = max(grid_w, math.ceil(title_w) + 40)
    left += (width - grid_w) // 2  # a title wider than the grid: centre the grid under it
    pixels = np.full((height, width, 4), 255, dtype=np.uint8)
    labels = []
    for h, tile in enumerate(tiles):
        r, c = divmod(h, cols)
        y, x = header + r * (size + top) + top, left + c * (cell + gap) + (cell - size) // 2
        pixels[y : y + size, x : x + size] = tile
        labels.append((x + size / 2, y - 4, names[h], "mb", LABEL_SIZE))
        if c == 0:  # left column: query axis
            labels += [(x - 4, y, "0", "rt", 10), (x - 4, y + size, str(n - 1), "rb", 10)]
            labels.append((x - 6, y + size / 2, "query i", "rm", LABEL_SIZE))
        if r == rows - 1 or h + cols >= result.n_heads:  # bottom of each column: key axis
            labels += [(x, y + size + 3, "0", "lt", 10), (x + size, y + size + 3, str(n - 1), "rt", 10)]
            labels.append((x + size / 2, y + size + 3, "key j", "mt", LABEL_SIZE))
    if shared is not None:
        x0, y0 = left + cols * (cell + gap) + 8, header + top
        bar_h = rows * (size + top) - top
        ramp = colormaps[DIVERGING](np.linspace(1, 0, bar_h), bytes=True)  # top = +limit
        pixels[y0 : y0 + bar_h, x0 : x0 + 14] = ramp[:, None, :]
        for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
            value = shared * (1 - 2 * frac)
            labels.append((x0 + 18, y0 + frac * (bar_h - 1), f"{value:+.3g}" if value else "0", "lm", 10))
    return Mosaic(pixels, title, tuple(labels))


def render_mosaic_image(mosaic: Mosaic):
    """The mosaic as a Pillow RGB image, texts in matplotlib's DejaVu Sans (Pillow's own font if absent)."""
    from PIL import Image, ImageDraw

    image = Image.fromarray(mosaic.pixels, "RGBA")
    draw = ImageDraw.Draw(image)
    fonts: dict[int, object] = {}
    for x, y, text, anchor, size in mosaic.labels:
        font = fonts.setdefault(size, _font(size))
        draw.text((x, y), text, fill=(0, 0, 0, 255), font=font, anchor=anchor)
    title_font = _font(TITLE_SIZE)
    for i, line in enumerate(mosaic.title.split("\n")):
        draw.text((mosaic.pixels.shape[1] / 2, 10 + TITLE_LINE * i), line, fill=(0, 0, 0, 255), font=title_font,
                  anchor="mt")  # fmt: skip
    return image.convert("RGB")


def render_mosaic_png(mosaic: Mosaic, path) -> None:
    """Write the mosaic as PNG through Pillow."""
    mosaic.savefig(path, format="png")


_ANCHOR_H = {"l": "left", "m": "center", "r": "right"}
_ANCHOR_V = {"t": "top", "m": "center", "b": "bottom"}


def mosaic_figure(mosaic: Mosaic, dpi: int = FIGURE_DPI):
    """The mosaic as a matplotlib Figure (for PDF/SVG, or to add to): the image fills one Axes whose data
    units are the mosaic's pixels, so texts stay on their panels at any savefig dpi."""
    height, width = mosaic.pixels.shape[:2]
    fig = _figure(width / dpi, height / dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(mosaic.pixels, interpolation="nearest", extent=(0, width, height, 0))
    ax.set_xlim(0, width), ax.set_ylim(height, 0), ax.set_axis_off()
    points = 72 / dpi  # a font size in pixels at `dpi`, in points
    for x, y, text, anchor, size in mosaic.labels:
        ax.text(x, y, text, ha=_ANCHOR_H[anchor[0]], va=_ANCHOR_V[anchor[1]], fontsize=size * points)
    for i, line in enumerate(mosaic.title.split("\n")):
        ax.text(width / 2, 10 + TITLE_LINE * i, line, ha="center", va="top", fontsize=TITLE_SIZE * points)
    return fig


@functools.lru_cache(maxsize=16)
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


def layer_kind_note(kind: str | None) -> str:
    """A title note for a layer that does not attend globally (a local window, its own rotary setting)."""
    return f" ({kind})" if kind and kind != "global" else ""


def causal_note(result) -> str:
    """A title suffix for causal models, whose softmax only ever sees k <= 0."""
    return "; causal: only k ≤ 0 used" if getattr(result, "causal", False) else ""


def conditioning_note(result) -> str:
    """A suffix for data-conditioned results (SPEC §13): how many texts, and which input (mean or position-mean)."""
    c = getattr(result, "conditioning", None)
    return f" on {c['n_texts']} texts ({c['input']} input)" if c else ""


def short_kind(kind: str | None) -> str:
    """A layer kind in a few words for a small panel title: the words before any bracketed explanation
    ('global, NoPE', 'local |k| <= 511, rope theta 10000', 'no softmax attention, Mamba state-space layers')."""
    return (kind or "").split(" (")[0]


def layer_kinds_line(kinds: list[str] | None) -> str:
    """'\nlayer kinds: global 0, 2; no softmax attention, gated short-convolution layers 1' (each kind in a few
    words, its layers as ranges), or '' when every layer has the same kind or the kinds are unknown."""
    if not kinds or len(set(kinds)) < 2:
        return ""
    groups: dict[str, list[int]] = {}
    for layer, kind in enumerate(kinds):
        groups.setdefault(short_kind(kind), []).append(layer)
    return "\nlayer kinds: " + "; ".join(f"{kind} {_ranges(layers)}" for kind, layers in groups.items())


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts, start = [], layers[0]
    for previous, layer in zip(layers, [*layers[1:], None]):
        if layer is None or layer != previous + 1:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
            start = layer
    return ", ".join(parts)


def quantization_note(result) -> str:
    """A suffix for the model's name in titles when its weights were de-quantised from a GGUF file."""
    quantization = getattr(result, "quantization", None)
    return f" ({quantization} GGUF, de-quantised)" if quantization else ""


def compare_heatmaps(rows, labels: list[str] | None = None):
    """Side-by-side P heatmaps of several models (paper Fig. 1), one panel per model (no blank panel),
    titled with the model's label (`labels`, default each row's `label`), each with its own colorbar:
    inner products of different models are on different scales. Returns a matplotlib Figure."""
    labels = list(labels) if labels is not None else [row.label for row in rows]
    fig = _figure(4.2 * len(rows), 4.1)
    axes = fig.subplots(
        1, len(rows), squeeze=False, gridspec_kw=dict(left=0.06, right=0.92, bottom=0.09, top=0.8, wspace=0.35)
    )
    for row, label, ax in zip(rows, labels, axes.flat):
        _matrix_panel(fig, ax, row.matrix, _symmetric_limit(row.matrix))
        name = getattr(row, "matrix_name", "P")
        n = row.matrix.shape[0]
        shaded = name != "P" and bool(getattr(row, "causal", False))
        if shaded:  # scores a causal model never uses (key after query, k = j - i > 0), as `profiles` shades them
            ax.fill([-0.5, n - 0.5, n - 0.5], [-0.5, -0.5, n - 0.5], color="0.8", alpha=0.85, lw=0)
        stat = f"R² = {format_r2(row.toeplitz_r2, 3)}" if name == "P" else name
        stat += "\ncausal: k > 0 shaded (unused)" if shaded else ""
        ax.set_title(f"{label}{quantization_note(row)}\n{stat}", fontsize=9)
        ax.set_xticks([0, n - 1]), ax.set_yticks([0, n - 1])
        ax.tick_params(labelsize=7, length=2)
        ax.set_xlabel("position j" if name == "P" else "key j", fontsize=8, labelpad=-6)
        ax.set_ylabel("position i" if name == "P" else "query i", fontsize=8, labelpad=-8)
    return fig
