"""The figure of a fine-tuning grid: one panel per task (main metric; plus the average over tasks), x =
mechanisms, the per-seed values as points (seeds joined by faint lines: the pairing), and mean ± s.e. as a
bar with error bars. Takes `GridResult.to_dict()`; returns a matplotlib Figure (the output layer saves it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from posprobe.plotting import _figure


def grid_figure(result: dict[str, Any]):
    """Panels: tasks (+ `average` with two or more tasks); markers per seed, mean ± s.e. in black."""
    tasks = list(result["tasks"]) + (["average"] if len(result["tasks"]) > 1 else [])
    mechanisms = list(result["mechanisms"])
    main = dict(result["main_metrics"]) | {"average": "average"}
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
        values = np.full((len(seeds), len(mechanisms)), np.nan)
        for run in result["runs"]:
            if task != "average" and run["task"] == task and run["mechanism"] in mechanisms:
                v = run["metrics"].get(metric)
                if v is not None:
                    values[seeds.index(run["seed"]), mechanisms.index(run["mechanism"])] = v
        if task == "average":  # per seed: mean over tasks of each task's main metric
            per_task = []
            for t in result["tasks"]:
                tv = np.full((len(seeds), len(mechanisms)), np.nan)
                for run in result["runs"]:
                    if run["task"] == t and run["mechanism"] in mechanisms:
                        v = run["metrics"].get(main[t])
                        if v is not None:
                            tv[seeds.index(run["seed"]), mechanisms.index(run["mechanism"])] = v
                per_task.append(tv)
            values = np.mean(per_task, axis=0)
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
        ax.set_title(f"{task} ({metric})" if task != "average" else "average over tasks", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.grid(axis="y", alpha=0.3)
    if len(seeds) <= 10:
        axes[0][0].legend(fontsize=6, loc="best")
    fig.suptitle("dev metric: per seed (points; lines join a seed) and mean ± s.e. (black)", fontsize=8)
    return fig
