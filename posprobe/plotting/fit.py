"""Figures for TISA fits (paper Fig. 6 style): each head's profile (dots) against its fitted scoring
function (offset added back), k = j - i on the x axis, R^2 in each panel's title.

Profiles exist only at integer k, so the fitted function is evaluated at the same integer k and drawn
through those points (markers joined by straight segments): no curve is drawn between integers, where a
narrow kernel would show a needle that the model never uses.

Speed: a grid of hundreds of matplotlib Axes costs seconds per hundred panels to build and draw (and
shared axes make it quadratic). All panels are therefore drawn in *one* Axes, each into its own box:
one line artist for all profiles, one for all fits, one collection for frames and zero lines, and a few
texts per panel. Each panel has its own vertical scale; its top and bottom values are written at its
left edge. matplotlib is imported inside the functions (no pyplot), so importing this module stays light.
"""

from __future__ import annotations

import numpy as np

from posprobe.plotting.base import quantization_note

PANEL_WIDTH, PANEL_HEIGHT = 1.55, 1.25  # inches per panel (including its title and gaps)


def fit_figure(result, fit):
    """The figure of one fit (`TisaFit`) of a `TisaFitResult`; a matplotlib Figure."""
    causal = getattr(result, "causal", False)
    w = result.window
    fitted = f"k = −{w}..0" if causal else f"|k| ≤ {w}"
    model = f"{result.model}{quantization_note(result)}"
    title = f"TISA fit, S={fit.n_kernels} — {model} ({result.mode} mode, fitted {fitted})"
    if causal:
        title += "; causal: only k ≤ 0 used by the model"
    if getattr(fit, "few_points", False):
        title += f"; only {fit.n_points} points for {3 * fit.n_kernels + 1} parameters"
    return tisa_fit_grid(
        result.offsets,
        result.profiles,
        fit.a,
        fit.b,
        fit.c,
        fit.offset,
        fit.r2,
        result.layers,
        result.window,
        title,
        result.shared_layers,
        holdout=tuple(getattr(result, "holdout_offsets", ())),
        holdout_r2=getattr(fit, "holdout_r2", None),
        causal=causal,
    )


def tisa_fit_grid(
    offsets: np.ndarray,
    profiles: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    offset: np.ndarray,
    r2: np.ndarray,
    layers: list[int],
    window: int,
    title: str = "",
    shared_layers: bool = False,
    holdout: tuple[int, ...] = (),
    holdout_r2: np.ndarray | None = None,
    causal: bool = False,
):
    """One panel per head, one row of panels per layer; returns a matplotlib Figure.

    `offsets` (K,) integer k = j - i increasing; `profiles` (L, H, K); `a`, `b`, `c` (L, H, S);
    `offset`, `r2` (L, H); `layers` (L,) layer indices for the row labels; `window` the half-width W
    of the fitted range k = -W..W (`causal`: k = -W..0, and nothing at k > 0 is drawn). `holdout`: offsets beyond
    the window the fit was scored on, drawn as open grey dots with the fitted function continued through them
    (the window's edge dotted), `holdout_r2` (L, H) in the panel titles. With `shared_layers` (ALBERT) only the
    first row is drawn, since every depth has the same fit.
    """
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D

    from posprobe.analysis.tisa_fit import tisa_function
    from posprobe.plotting.base import _figure
    from posprobe.plotting.profiles import _inches

    offsets = np.asarray(offsets)
    profiles = np.asarray(profiles, dtype=np.float64)
    n_rows = 1 if shared_layers else profiles.shape[0]
    n_heads = profiles.shape[1]
    held = np.isin(offsets, np.asarray(holdout, dtype=np.int64))
    inside = (np.abs(offsets) <= window) & ~((offsets > 0) & causal)
    keep = inside | held  # drawn: the window and the held-out offsets beyond it
    k = offsets[keep].astype(np.float64)  # integer offsets drawn
    fit_mask, held_mask = inside[keep], held[keep]
    lo_k, hi_k = k.min(), k.max()
    data = profiles[:n_rows][:, :, keep]  # (R, H, K_d)
    fitted = tisa_function(k, a[:n_rows], b[:n_rows], c[:n_rows]) + np.asarray(offset)[:n_rows, :, None]

    left, right, bottom, header = 0.55, 0.1, 0.45, 0.9  # inches around the grid
    note = " (one shared layer, replicated at every depth)" if shared_layers else ""
    grid = left + right + PANEL_WIDTH * n_heads
    width = max(grid, _inches((title or "TISA fit") + note, 9) + 0.3, 7.5)  # the title and the legend fit
    left += (width - grid) / 2  # the grid centred under them
    height = bottom + header + PANEL_HEIGHT * n_rows
    fig = _figure(width, height)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width), ax.set_ylim(0, height), ax.set_axis_off()  # data units are inches

    # Panel boxes in inches: plot area inside each cell, leaving room for the title and the scale.
    pad_l, pad_r, pad_b, pad_t = 0.36, 0.06, 0.12, 0.24
    box_w, box_h = PANEL_WIDTH - pad_l - pad_r, PANEL_HEIGHT - pad_b - pad_t
    x0 = left + PANEL_WIDTH * np.arange(n_heads) + pad_l  # (H,)
    y0 = bottom + PANEL_HEIGHT * (n_rows - 1 - np.arange(n_rows)) + pad_b  # (R,) first layer on top
    lo = np.minimum(data.min(axis=2), fitted.min(axis=2))  # (R, H)
    hi = np.maximum(data.max(axis=2), fitted.max(axis=2))
    span = np.where(hi > lo, hi - lo, 1.0)
    lo, hi = lo - 0.08 * span, hi + 0.08 * span
    to_x = lambda kk: (kk - lo_k) / (hi_k - lo_k) * box_w  # noqa: E731  (an offset -> inches inside a box)
    xs = x0[None, :, None] + to_x(k)  # (1, H, K_d)
    to_y = lambda v: y0[:, None, None] + (v - lo[..., None]) / (hi - lo)[..., None] * box_h  # noqa: E731

    def with_breaks(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(R, H, K) points as one polyline with NaN breaks between panels."""
        x = np.broadcast_to(x, y.shape)
        nan = np.full(y.shape[:-1] + (1,), np.nan)
        return np.concatenate([x, nan], -1).ravel(), np.concatenate([y, nan], -1).ravel()

    fx, fy = with_breaks(xs, to_y(fitted))
    ax.add_line(Line2D(fx, fy, color="tab:red", lw=1.0, marker="_", ms=3, label="TISA fit (at integer k)"))
    px, py = with_breaks(xs[..., fit_mask], to_y(data[..., fit_mask]))
    ax.add_line(Line2D(px, py, color="tab:blue", ls="none", marker=".", ms=3, label="profile (fitted)"))
    if held_mask.any():
        hx, hy = with_breaks(xs[..., held_mask], to_y(data[..., held_mask]))
        ax.add_line(Line2D(hx, hy, color="0.45", ls="none", marker="o", ms=2.2, mfc="none", mew=0.6,
                           label="profile (held out)"))  # fmt: skip

    gx, gy = np.meshgrid(x0, y0)  # (R, H) lower-left corners
    frames = [
        [(x, y), (x + box_w, y), (x + box_w, y + box_h), (x, y + box_h), (x, y)] for x, y in zip(gx.ravel(), gy.ravel())
    ]
    zero_x = gx.ravel() + to_x(0.0)
    zeros = [[(x, y), (x, y + box_h)] for x, y in zip(zero_x, gy.ravel())]
    ax.add_collection(LineCollection(zeros, colors="0.85", linewidths=0.6, zorder=0))
    if held_mask.any():  # the window's edges, where the held-out offsets begin
        edges = [e for e in (-window - 0.5, window + 0.5) if lo_k < e < hi_k]
        marks = [[(x + to_x(e), y), (x + to_x(e), y + box_h)] for x, y in zip(gx.ravel(), gy.ravel()) for e in edges]
        ax.add_collection(LineCollection(marks, colors="0.6", linewidths=0.5, linestyles=":", zorder=0))
    ax.add_collection(LineCollection(frames, colors="0.4", linewidths=0.5))

    for row in range(n_rows):
        for h in range(n_heads):
            x, y = x0[h], y0[row]
            if np.isnan(profiles[row, h]).all():  # a head the layer does not have (SPEC §9): no fit
                ax.text(x + box_w / 2, y + box_h + 0.04, f"L{layers[row]} H{h}: no such head", fontsize=6,
                        ha="center", va="bottom")  # fmt: skip
                continue
            out = ""
            if holdout_r2 is not None and held_mask.any():
                value = float(np.asarray(holdout_r2)[row, h])
                out = f" out={value:.2f}" if np.isfinite(value) else " out=—"
            ax.text(x + box_w / 2, y + box_h + 0.04, f"L{layers[row]} H{h} R²={r2[row, h]:.3f}{out}", fontsize=6,
                    ha="center", va="bottom")  # fmt: skip
            ax.text(x - 0.03, y + box_h, f"{hi[row, h]:.2g}", fontsize=5, ha="right", va="top", color="0.3")
            ax.text(x - 0.03, y, f"{lo[row, h]:.2g}", fontsize=5, ha="right", va="bottom", color="0.3")
    ends = {int(lo_k), 0, int(hi_k)}  # and the window's edges where they are not crowded against the ends
    ticks = sorted(
        ends
        | {e for e in (-window, window) if lo_k <= e <= hi_k and min(abs(e - x) for x in ends) >= 0.25 * (hi_k - lo_k)}
    )
    for h in range(n_heads):  # k ticks under the bottom row only
        for kk in ticks:
            ha = "left" if kk == lo_k else "right" if kk == hi_k else "center"
            ax.text(x0[h] + to_x(kk), y0[-1] - 0.03, f"{kk:+d}" if kk else "0", fontsize=5.5, ha=ha, va="top")
    ax.text(width / 2, 0.08, "k = j − i (positive = later key)", fontsize=8, ha="center", va="bottom")
    ax.text(width / 2, height - 0.12, (title or "TISA fit") + note, fontsize=9, ha="center", va="top")
    ax.legend(loc="upper left", bbox_to_anchor=(0.1 / width, 1 - 0.3 / height), fontsize=6.5, frameon=False, ncol=3)
    scale = "each panel has its own vertical scale (top and bottom values at its left)"
    if held_mask.any():
        scale += "; out = R² on the held-out offsets against the window's mean"
    ax.text(0.15, height - 0.5, scale, fontsize=6, ha="left", va="top", color="0.3")  # under the legend
    return fig
