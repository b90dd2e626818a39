"""Figures of head profiles over k = j - i (paper Figs. 3, 6, 7): one page per layer, one panel per head, each with
the profile (thick black) and, where given, sections of the score matrix at a few query rows i (thin lines).

Speed: `posprobe profiles --layers all` writes one page per layer (30 for SmolLM2), and a grid of matplotlib Axes
per page cost more than the analysis. `ProfilePages` lays a page out once, in one Axes whose data units are
inches (as `plotting_fit` does): frames, zero lines, the unused k > 0 of a causal model, head titles, k ticks and
the legend are drawn once into an Agg canvas and kept; each page then restores that background and draws only what
changes (the lines of every panel as two collections, each panel's top and bottom values, the page title), and
Pillow writes the PNG. PDF and SVG pages go through matplotlib's own savefig. Panel and page sizes follow the number
of panels and the texts, never the number of positions. matplotlib is imported lazily, without pyplot.
"""

from __future__ import annotations

import numpy as np

from posprobe.analysis.toeplitz import is_flat
from posprobe.plotting.base import (
    FIGURE_DPI,
    _figure,
    _grid,
    causal_note,
    conditioning_note,
    layer_kind_note,
    quantization_note,
)

PANEL_WIDTH, PANEL_HEIGHT = 2.35, 1.6  # inches per panel, its title and ticks included
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_BOTTOM, HEADER = 0.15, 0.15, 0.45, 0.72  # inches around the grid
_PAD_L, _PAD_R, _PAD_B, _PAD_T = 0.42, 0.08, 0.2, 0.24  # inches inside each cell around the plot box
SECTION_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
OVERLAY_COLOUR = "tab:blue"
SECOND_COLOUR = "tab:orange"  # a variant of the overlay (a(k) without the first token)
SPARSE_COLOUR = "#f3e9d2"  # offsets resting on few data


class ProfilePages:
    """Pages of profile panels sharing one layout.

    `ks` (K,) integer offsets k = j - i; `profiles` (P, H, K) for P pages of H panels; `sections` (P, H, R, K) or
    None, labelled `section_labels` (R,); `page_titles` (P,); `panel_titles` (H,), or (P, H) when they change from
    page to page; `causal`: the unused side k > 0 is shaded. Optional, (P, H, K) each: `guides`, drawn dashed grey
    on the profile's scale, and `overlays`, drawn blue on a scale of their own (its values on the right of each
    panel); `second_overlays`, drawn dotted on the overlay's scale (a variant of the overlay); `sparse` (P, K) bool:
    offsets resting on few data (shaded, `labels["sparse"]` in the legend). Each panel's left margin gives the span
    Δ of its profile (its own scale: a panel spanning 0.4 is drawn as tall as one spanning 3). `labels`
    names the
    profile, overlay, second overlay and guide lines in the legend. `figure(p)` is page p as a
    matplotlib Figure; `write(p, path, fmt)` writes it (PNG from the kept background, the fast path)."""

    def __init__(self, ks, profiles, sections=None, section_labels=(), page_titles=(), panel_titles=(), causal=False,
                 overlays=None, guides=None, labels=None, second_overlays=None, sparse=None):  # fmt: skip
        self.ks = np.asarray(ks, dtype=np.float64)
        self.profiles = np.asarray(profiles, dtype=np.float64)
        self.sections = None if sections is None else np.asarray(sections, dtype=np.float64)
        self.overlays = None if overlays is None else np.asarray(overlays, dtype=np.float64)
        self.second = None if second_overlays is None or overlays is None else np.asarray(second_overlays, np.float64)
        self.sparse = None if sparse is None or not np.any(sparse) else np.asarray(sparse, dtype=bool)
        self.guides = None if guides is None or not np.isfinite(guides).any() else np.asarray(guides, np.float64)
        self.labels = {"profile": "profile", "overlay": "overlay", "second": "second overlay", "guide": "guide",
                       "sparse": "few data", **(labels or {})}  # fmt: skip
        n_pages, self.n_panels, _ = self.profiles.shape
        self.page_titles = list(page_titles) or [""] * n_pages
        titles = list(panel_titles) or [f"head {h}" for h in range(self.n_panels)]
        self._titles_per_page = bool(titles) and not isinstance(titles[0], str)
        self.panel_titles = [list(t) for t in titles] if self._titles_per_page else titles
        self.section_labels, self.causal = list(section_labels), causal
        self.pad_r = _PAD_R + (0.3 if self.overlays is not None else 0.0)  # room for the overlay's scale
        self.rows, self.cols = _grid(self.n_panels)
        self._title_lines = max((t.count("\n") + 1 for t in self.page_titles), default=1)
        grid = MARGIN_LEFT + MARGIN_RIGHT + PANEL_WIDTH * self.cols
        widest = max((_inches(line, 10) for t in self.page_titles for line in t.split("\n")), default=0.0)
        self.width = max(grid, widest + 0.4)  # the title fits
        self.left = MARGIN_LEFT + (self.width - grid) / 2  # the grid centred under a wider title
        entry = max(_inches(label, 6.5) for label in self._legend_labels()) + 0.45  # a label, its handle, spacing
        n_labels = len(self._legend_labels())
        self._legend_cols = max(1, min(n_labels, int((self.width - 2 * MARGIN_LEFT) // entry)))
        extra_rows = -(-n_labels // self._legend_cols) - 1
        self.height = MARGIN_BOTTOM + HEADER + 0.16 * (self._title_lines - 1) + 0.14 * extra_rows
        self.height += PANEL_HEIGHT * self.rows
        self._build()
        self._page = None
        self._background = None

    def _legend_labels(self) -> list[str]:
        labels = [self.labels["profile"]]
        labels += [self.labels["overlay"]] if self.overlays is not None else []
        labels += [self.labels["second"]] if self.second is not None else []
        labels += [self.labels["guide"]] if self.guides is not None else []
        labels += [self.labels["sparse"]] if self.sparse is not None else []
        return labels + self.section_labels + (["k > 0: never used (causal)"] if self.causal else [])

    # -- layout ------------------------------------------------------------------------------------
    def _box(self, panel: int) -> tuple[float, float, float, float]:
        """(x, y, width, height) in inches of panel `panel`'s plot box; row 0 on top."""
        r, c = divmod(panel, self.cols)
        x = self.left + c * PANEL_WIDTH + _PAD_L
        y = MARGIN_BOTTOM + (self.rows - 1 - r) * PANEL_HEIGHT + _PAD_B
        return x, y, PANEL_WIDTH - _PAD_L - self.pad_r, PANEL_HEIGHT - _PAD_B - _PAD_T

    def _x(self, panel: int, k) -> np.ndarray:
        x, _, w, _ = self._box(panel)
        lo, hi = self.ks[0], self.ks[-1]
        return x + (np.asarray(k, dtype=np.float64) - lo) / max(hi - lo, 1.0) * w

    def _build(self) -> None:
        from matplotlib.collections import LineCollection
        from matplotlib.lines import Line2D
        from matplotlib.patches import Rectangle

        fig = _figure(self.width, self.height)
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, self.width), ax.set_ylim(0, self.height), ax.set_axis_off()
        frames, zeros = [], []
        lo_k, hi_k = int(self.ks[0]), int(self.ks[-1])
        bottom_of_column = {}
        for h in range(self.n_panels):
            x, y, w, bh = self._box(h)
            frames.append([(x, y), (x + w, y), (x + w, y + bh), (x, y + bh), (x, y)])
            if lo_k < 0 < hi_k:
                zeros.append([(self._x(h, 0), y), (self._x(h, 0), y + bh)])
            if self.causal and hi_k > 0:  # the side a causal model never uses
                x0 = float(self._x(h, 0))
                ax.add_patch(Rectangle((x0, y), x + w - x0, bh, facecolor="0.93", edgecolor="none", zorder=0))
            if not self._titles_per_page:
                ax.text(x + w / 2, y + bh + 0.05, self.panel_titles[h], fontsize=8, ha="center", va="bottom")
            bottom_of_column[h % self.cols] = h
        for h in bottom_of_column.values():  # k ticks under the lowest panel of each column
            _, y, _, _ = self._box(h)
            for kk in sorted({lo_k, 0, hi_k} if lo_k < 0 < hi_k else {lo_k, hi_k}):
                ha = "left" if kk == lo_k else "right" if kk == hi_k else "center"
                ax.text(self._x(h, kk), y - 0.04, f"{kk:+d}" if kk else "0", fontsize=6.5, ha=ha, va="top")
        ax.add_collection(LineCollection(zeros, colors="0.75", linewidths=0.6, zorder=1))
        ax.add_collection(LineCollection(frames, colors="0.35", linewidths=0.6, zorder=3))
        ax.text(self.width / 2, 0.1, "k = j − i (positive = later key);  Δ: span of the black line (own scale)",
                fontsize=8.5, ha="center", va="bottom")  # fmt: skip
        handles = [Line2D([], [], color="black", lw=1.8, label=self.labels["profile"])]
        if self.overlays is not None:
            handles.append(Line2D([], [], color=OVERLAY_COLOUR, lw=1.0, label=self.labels["overlay"]))
        if self.second is not None:
            handles.append(Line2D([], [], color=SECOND_COLOUR, lw=1.2, ls=":", label=self.labels["second"]))
        if self.guides is not None:
            handles.append(Line2D([], [], color="grey", lw=1.0, ls="--", label=self.labels["guide"]))
        handles += [Line2D([], [], color=SECTION_COLOURS[s % len(SECTION_COLOURS)], lw=0.8, label=label)
                    for s, label in enumerate(self.section_labels)]  # fmt: skip
        if self.sparse is not None:
            handles.append(Rectangle((0, 0), 1, 1, facecolor=SPARSE_COLOUR, label=self.labels["sparse"]))
        if self.causal:
            handles.append(Rectangle((0, 0), 1, 1, facecolor="0.93", label="k > 0: never used (causal)"))
        top = 1 - (0.42 + 0.16 * (self._title_lines - 1)) / self.height
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(MARGIN_LEFT / self.width, top), fontsize=6.5,
                  frameon=False, ncol=self._legend_cols, handlelength=1.6, columnspacing=1.2)  # fmt: skip
        # what changes from page to page
        self._sections = LineCollection([], linewidths=0.8, alpha=0.75, zorder=2)
        self._profile = LineCollection([], colors="black", linewidths=1.8, zorder=2)
        self._overlay = LineCollection([], colors=OVERLAY_COLOUR, linewidths=1.0, zorder=2)
        self._guide = LineCollection([], colors="grey", linewidths=1.0, linestyles="--", zorder=2)
        self._second = LineCollection([], colors=SECOND_COLOUR, linewidths=1.2, linestyles=":", zorder=2)
        from matplotlib.collections import PolyCollection

        self._sparse = PolyCollection([], facecolors=SPARSE_COLOUR, edgecolors="none", zorder=0.5)
        ax.add_collection(self._sparse)
        for lines in (self._sections, self._guide, self._second, self._overlay, self._profile):
            ax.add_collection(lines)
        self._scale, self._overlay_scale, self._panel_title, self._span = [], [], [], []
        for h in range(self.n_panels):
            x, y, w, bh = self._box(h)
            self._span.append(ax.text(x - 0.04, y + bh / 2, "", fontsize=6, ha="right", va="center", color="0.3"))
            self._scale.append(ax.text(x - 0.04, y + bh, "", fontsize=6, ha="right", va="top", color="0.3"))
            self._scale.append(ax.text(x - 0.04, y, "", fontsize=6, ha="right", va="bottom", color="0.3"))
            if self.overlays is not None:
                for at, va in ((y + bh, "top"), (y, "bottom")):
                    label = ax.text(x + w + 0.04, at, "", fontsize=6, ha="left", va=va, color=OVERLAY_COLOUR)
                    self._overlay_scale.append(label)
            if self._titles_per_page:
                title = ax.text(x + w / 2, y + bh + 0.05, "", fontsize=8, ha="center", va="bottom")
                self._panel_title.append(title)
        self._title = fig.suptitle(" ", fontsize=10, y=1 - 0.1 / self.height, va="top")  # the page's
        self.fig, self.ax = fig, ax
        self._dynamic = [self._sparse, *self._span, self._sections, self._guide, self._second, self._overlay,
                         self._profile, *self._scale,
                         *self._overlay_scale, *self._panel_title, self._title]  # fmt: skip

    def _set_page(self, page: int) -> None:
        """Point the changing artists at page `page`'s data."""
        if self._page == page:
            return
        prof = self.profiles[page]  # (H, K)
        secs = None if self.sections is None else self.sections[page]  # (H, R, K)
        guides = None if self.guides is None else self.guides[page]  # (H, K)
        lines = {"profile": [], "sections": [], "guide": [], "overlay": [], "second": []}
        colours, bands = [], []
        for h in range(self.n_panels):
            parts = (
                [prof[h]]
                + ([secs[h].ravel()] if secs is not None else [])
                + ([guides[h]] if guides is not None else [])
            )
            lo, hi = _padded_range(np.concatenate(parts))
            x, y, _, bh = self._box(h)
            xs = self._x(h, self.ks)

            def to_y(v, y=y, bh=bh, lo=lo, hi=hi):
                return y + (v - lo) / (hi - lo) * bh

            lines["profile"] += _runs(xs, to_y(prof[h]))
            if secs is not None:
                for s in range(secs.shape[1]):
                    runs = _runs(xs, to_y(secs[h, s]))
                    lines["sections"] += runs
                    colours += [SECTION_COLOURS[s % len(SECTION_COLOURS)]] * len(runs)
            if guides is not None:
                lines["guide"] += _runs(xs, to_y(guides[h]))
            self._scale[2 * h].set_text(f"{hi:.3g}")
            self._scale[2 * h + 1].set_text(f"{lo:.3g}")
            finite = prof[h][np.isfinite(prof[h])]
            self._span[h].set_text(f"Δ {np.ptp(finite):.2g}" if finite.size > 1 else "")
            if self.sparse is not None:  # runs of sparse offsets as bands, half a step beyond each end
                step = (xs[1] - xs[0]) / 2 if len(xs) > 1 else 0.0
                for a, b in _true_runs(self.sparse[page]):
                    x0, x1 = max(xs[a] - step, x), min(xs[b - 1] + step, x + self._box(h)[2])
                    bands.append([(x0, y), (x1, y), (x1, y + bh), (x0, y + bh)])
            if self.overlays is not None:
                over = self.overlays[page, h]
                both = over if self.second is None else np.concatenate([over, self.second[page, h]])
                o_lo, o_hi = _padded_range(both)
                if np.nanmin(both, initial=np.inf) >= 0:  # a non-negative overlay (probabilities) stays so
                    o_lo = max(o_lo, 0.0)
                lines["overlay"] += _runs(xs, y + (over - o_lo) / (o_hi - o_lo) * bh)
                if self.second is not None:
                    lines["second"] += _runs(xs, y + (self.second[page, h] - o_lo) / (o_hi - o_lo) * bh)
                self._overlay_scale[2 * h].set_text(f"{o_hi:.3g}")
                self._overlay_scale[2 * h + 1].set_text(f"{o_lo:.3g}")
            if self._titles_per_page:
                self._panel_title[h].set_text(self.panel_titles[page][h])
        self._profile.set_segments(lines["profile"])
        self._sections.set_segments(lines["sections"])
        self._sections.set_colors(colours or ["none"])
        self._guide.set_segments(lines["guide"])
        self._overlay.set_segments(lines["overlay"])
        self._second.set_segments(lines["second"])
        self._sparse.set_verts(bands)
        self._title.set_text(self.page_titles[page])
        self._page = page

    # -- output ------------------------------------------------------------------------------------
    def figure(self, page: int):
        """Page `page` as a matplotlib Figure (the same Figure object for every page of these pages)."""
        for artist in self._dynamic:
            artist.set_animated(False)
        self._background = None
        self._set_page(page)
        return self.fig

    def write(self, page: int, path, fmt: str = "png") -> None:
        """Write page `page` to `path` as `fmt` (png: the kept background plus the changing artists, via Pillow)."""
        if fmt != "png":
            self.figure(page).savefig(path, format=fmt, dpi=FIGURE_DPI)
            return
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from PIL import Image

        if self._background is None:
            for artist in self._dynamic:
                artist.set_animated(True)  # left out of the background
            canvas = FigureCanvasAgg(self.fig)
            canvas.draw()
            self._canvas, self._background = canvas, canvas.copy_from_bbox(self.fig.bbox)
        self._set_page(page)
        self._canvas.restore_region(self._background)
        renderer = self._canvas.get_renderer()
        for artist in self._dynamic:
            artist.draw(renderer)
        pixels = np.asarray(self._canvas.buffer_rgba())[..., :3]
        Image.fromarray(pixels).save(path, format="PNG", compress_level=1)

    def writer(self, page: int, fmt: str = "png"):
        """A `posprobe.formats.writing.write_files` writer of page `page`."""
        return lambda path: self.write(page, path, fmt)


def _padded_range(values: np.ndarray) -> tuple[float, float]:
    """(lo, hi) of the finite `values`, padded by 6%; a flat line's round-off is not magnified into a shape."""
    finite = values[np.isfinite(values)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    span = max(abs(hi), 1.0) if is_flat(np.array([lo, hi])) else hi - lo
    return lo - 0.06 * span, hi + 0.06 * span


def _true_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) of each run of consecutive True values of `mask`."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], np.asarray(mask, dtype=np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def _runs(xs: np.ndarray, ys: np.ndarray) -> list[np.ndarray]:
    """The (x, y) polylines of the runs of consecutive finite values of `ys` (offsets without data break a line)."""
    ok = np.isfinite(ys)
    if ok.all():
        return [np.column_stack([xs, ys])]
    edges = np.flatnonzero(np.diff(np.concatenate([[0], ok.astype(np.int8), [0]])))
    return [np.column_stack([xs[a:b], ys[a:b]]) for a, b in zip(edges[::2], edges[1::2])]


def _inches(text: str, points: float) -> float:
    """Width of `text` in DejaVu Sans at `points`, in inches (what sizes the page around its texts)."""
    from posprobe.plotting.base import _font

    return _font(max(1, round(points * FIGURE_DPI / 72))).getlength(text) / FIGURE_DPI


def profile_pages(result) -> ProfilePages:
    """The pages of a `ProfileResult`: one per computed layer, one panel per head, the profile over k = -w..w and
    the sections at its `section_rows` (none where the matrices are Toeplitz by construction: they equal it)."""
    w = result.window
    centre = result.n_positions - 1
    ks = np.arange(-w, w + 1)
    notes = causal_note(result)
    by_construction = bool(getattr(result, "toeplitz_by_construction", False))
    if by_construction:  # every section equals the profile: drawing them (and a legend for them) shows nothing
        notes += "; Toeplitz by construction (every section equals the profile)"
    kinds = getattr(result, "layer_kinds", None) or [None] * len(result.layers)
    titles = [
        f"{result.model}{quantization_note(result)}\npositional profiles, layer {l}{layer_kind_note(kind)}, "
        f"{result.mode} mode{conditioning_note(result)}{notes}"
        for l, kind in zip(result.layers, kinds)
    ]
    from posprobe.analysis.fhat import present_heads

    panel_titles = []
    if hasattr(result, "peak_offsets"):  # a peak the window cuts off is named in its panel's title
        peaks = result.peak_offsets()
        if (np.abs(np.nan_to_num(peaks)) > w).any():
            titles = [t + f"\n(peak k): the head's maximum lies beyond the drawn ±{w}" for t in titles]
        present = present_heads(result.profiles, 1)  # a head the layer does not have (SPEC §9): named so
        panel_titles = [
            [(f"head {h}" + (f" (peak {int(k):+d})" if np.isfinite(k) and abs(k) > w else "")) if here else
             f"head {h}: no such head" for h, (k, here) in enumerate(zip(row, here_row))]
            for row, here_row in zip(peaks, present)
        ]  # fmt: skip
    return ProfilePages(
        ks,
        result.profiles[:, :, centre - w : centre + w + 1],
        None if by_construction else result.sections,
        [] if by_construction else [f"i = {row}" for row in result.section_rows],
        titles,
        panel_titles,
        causal=bool(getattr(result, "causal", False)),
    )


def profile_grid(result, layer_index: int = 0):
    """Per head: sections of F_hat_P at 5 rows i (thin lines) and the profile (thick), over k = j - i, for
    `result.layers[layer_index]`; a matplotlib Figure. Paper Figs. 3, 6 and 7: when F_hat_P is near-Toeplitz the
    sections coincide with the profile."""
    return profile_pages(result).figure(layer_index)
