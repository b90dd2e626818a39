"""Figures for TISA fits (paper Fig. 6 style): each head's profile (dots) against its fitted scoring
function (line, offset added back) over the fit window, k = j - i on the x axis, R^2 in each title.

matplotlib is imported inside the functions (Agg backend), so importing this module stays light.
"""

from __future__ import annotations

import numpy as np


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
):
    """One panel per head, one row of panels per layer.

    `offsets` (K,) integer k = j - i increasing; `profiles` (L, H, K); `a`, `b`, `c` (L, H, S);
    `offset`, `r2` (L, H); `layers` (L,) layer indices for the row labels; `window` the half-width W
    of the plotted range k = -W..W. With `shared_layers` (ALBERT) only the first row is drawn, since
    every depth has the same fit. Returns a matplotlib Figure.
    """
    from posprobe.analysis.tisa_fit import tisa_function
    from posprobe.plotting import _figure

    offsets = np.asarray(offsets)
    profiles = np.asarray(profiles, dtype=np.float64)
    n_rows = 1 if shared_layers else profiles.shape[0]
    n_heads = profiles.shape[1]
    keep = np.abs(offsets) <= window
    k = offsets[keep]
    fine = np.linspace(-window, window, 20 * window + 1)
    height = 1.7 * n_rows + 0.8
    fig = _figure(1.9 * n_heads, height)
    axes = fig.subplots(n_rows, n_heads, squeeze=False, sharex=True)
    for row in range(n_rows):
        curves = tisa_function(fine, a[row], b[row], c[row]) + offset[row][:, None]  # (H, F)
        for h in range(n_heads):
            ax = axes[row, h]
            ax.plot(k, profiles[row, h, keep], ".", ms=3, color="tab:blue", label="profile")
            ax.plot(fine, curves[h], "-", lw=1.2, color="tab:red", label="TISA fit")
            ax.axvline(0, color="0.8", lw=0.6, zorder=0)
            ax.set_title(f"L{layers[row]} H{h}  R²={r2[row, h]:.3f}", fontsize=7)
            ax.tick_params(labelsize=6)
            if row == n_rows - 1:
                ax.set_xlabel("k = j − i", fontsize=7)
    axes[0, 0].legend(fontsize=6, loc="best", frameon=False)
    note = " (one shared layer, replicated at every depth)" if shared_layers else ""
    fig.suptitle((title or "TISA fit") + note, fontsize=9, y=1 - 0.08 / height, va="top")
    # fixed margins: tight_layout costs seconds on a 12 x 12 grid
    fig.subplots_adjust(
        left=0.04, right=0.99, bottom=0.3 / height + 0.03, top=1 - 0.7 / height, wspace=0.35, hspace=0.45
    )
    return fig
