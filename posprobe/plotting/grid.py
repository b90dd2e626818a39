"""The figure of a fine-tuning grid: one panel per task (main metric; plus the average over tasks), x =
mechanisms, the per-seed values as points (seeds joined by faint lines: the pairing), and mean ± s.e. as a
black square with error bars. Takes the panels `posprobe.glue.grid_report.grid_panels` computes from a grid's
results; returns a matplotlib Figure (the output layer saves it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from posprobe.plotting.base import _figure


def grid_figure(panels: Sequence[tuple[str, np.ndarray, Sequence]], mechanisms: Sequence[str], seeds: Sequence):
    """`panels`: (title, values (seeds, mechanisms) with NaN where missing, per mechanism (mean, s.e.) or None).
    Markers per seed, mean ± s.e. in black."""
    mechanisms, seeds = list(mechanisms), list(seeds)
    width = max(4.6, max(3.2, 0.7 * len(mechanisms) + 1.6) * len(panels))
    fig = _figure(width, 3.4)
    axes = fig.subplots(
        1, len(panels), squeeze=False, gridspec_kw=dict(left=0.7 / width, right=0.98, bottom=0.14, top=0.84, wspace=0.3)
    )
    x = np.arange(len(mechanisms), dtype=float)
    for p, (ax, (title, values, summary)) in enumerate(zip(axes[0], panels)):
        jitter = np.linspace(-0.12, 0.12, len(seeds)) if len(seeds) > 1 else np.zeros(1)
        for s, seed in enumerate(seeds):
            ax.plot(x + jitter[s], values[s], color="0.75", lw=0.6, zorder=1)
            ax.scatter(x + jitter[s], values[s], s=14, zorder=2, label=f"seed {seed}" if p == 0 else None)
        for i, row in enumerate(summary):
            if row is None:
                continue
            ax.errorbar(i + 0.3, row[0], yerr=row[1] or 0.0, fmt="s", color="black", ms=4, capsize=3)
        ax.set_xticks(x, mechanisms, rotation=30 if len(mechanisms) > 3 else 0)
        ax.set_xlim(-0.5, len(mechanisms) - 0.3)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.grid(axis="y", alpha=0.3)
    if len(seeds) <= 10:
        axes[0][0].legend(fontsize=6, loc="best")
    fig.suptitle("dev metric: per seed (points; lines join a seed) and mean ± s.e. (black)", fontsize=8)
    return fig
