"""The figure of a fine-tuning grid: one panel per task (main metric; plus the average over tasks), x =
mechanisms, the per-seed values as points (seeds joined by faint lines: the pairing), and mean ± s.e. as a
black square with error bars. Takes `GridResult.to_dict()`; returns a matplotlib Figure (the output layer saves it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from posprobe.glue.grid_report import AVERAGE, average_seed_values, seed_values
from posprobe.plotting import _figure


def grid_figure(result: dict[str, Any]):
    """Panels: tasks (+ `average` with two or more tasks); markers per seed, mean ± s.e. in black."""
    tasks = list(result["tasks"]) + ([AVERAGE] if len(result["tasks"]) > 1 else [])
    mechanisms = list(result["mechanisms"])
    main = dict(result["main_metrics"]) | {AVERAGE: AVERAGE}
    summary = {(r["task"], r["mechanism"], r["metric"]): r for r in result["summary"]}
    seeds = list(result["seeds"])
    width = max(4.6, max(3.2, 0.7 * len(mechanisms) + 1.6) * len(tasks))
    fig = _figure(width, 3.4)
    axes = fig.subplots(
        1, len(tasks), squeeze=False, gridspec_kw=dict(left=0.7 / width, right=0.98, bottom=0.14, top=0.84, wspace=0.3)
    )
    x = np.arange(len(mechanisms), dtype=float)
    for ax, task in zip(axes[0], tasks):
        metric = main[task]
        runs = result["runs"]
        columns = [  # per mechanism, its value for every seed (None: missing or undefined)
            average_seed_values(runs, result["tasks"], main, m, seeds)
            if task == AVERAGE
            else seed_values(runs, task, m, metric, seeds)
            for m in mechanisms
        ]
        values = np.array([[np.nan if v is None else float(v) for v in col] for col in columns]).T  # (seeds, mechs)
        jitter = np.linspace(-0.12, 0.12, len(seeds)) if len(seeds) > 1 else np.zeros(1)
        for s, seed in enumerate(seeds):
            ax.plot(x + jitter[s], values[s], color="0.75", lw=0.6, zorder=1)
            ax.scatter(x + jitter[s], values[s], s=14, zorder=2, label=f"seed {seed}" if task == tasks[0] else None)
        for i, mechanism in enumerate(mechanisms):
            row = summary.get((task, mechanism, metric))
            if row is None or row["mean"] is None:
                continue
            ax.errorbar(i + 0.3, row["mean"], yerr=row["stderr"] or 0.0, fmt="s", color="black", ms=4, capsize=3)
        ax.set_xticks(x, mechanisms, rotation=30 if len(mechanisms) > 3 else 0)
        ax.set_xlim(-0.5, len(mechanisms) - 0.3)
        ax.set_title(f"{task} ({metric})" if task != AVERAGE else "average over tasks", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.grid(axis="y", alpha=0.3)
    if len(seeds) <= 10:
        axes[0][0].legend(fontsize=6, loc="best")
    fig.suptitle("dev metric: per seed (points; lines join a seed) and mean ± s.e. (black)", fontsize=8)
    return fig
