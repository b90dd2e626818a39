"""Figures of `posprobe ablate` (issue 46): the effects of the edits against the controls, the loss by position of
every run overlaid (context), and the needle grid of the baseline beside each edited run (needle)."""

from __future__ import annotations

import numpy as np

from posprobe.plotting.base import _figure

SMOOTH = 16  # positions in the running mean of the loss-by-position curves


def effects_figure(result):
    """One bar per edit (its delta with the 95% interval) and one per control seed, the controls in gray."""
    runs = [*result.runs, *result.controls]
    effects = [result.effect(run) for run in runs]
    fig = _figure(max(7.0, 0.45 * len(runs) + 3.0), 4.4)
    ax = fig.add_axes([0.16, 0.32, 0.8, 0.54])
    x = np.arange(len(runs))
    deltas = [e["delta"] if e["delta"] is not None else np.nan for e in effects]
    colors = ["tab:red" if run in result.runs else "tab:gray" for run in runs]
    lower = [d - e["interval"][0] if e["interval"] else 0.0 for d, e in zip(deltas, effects)]
    upper = [e["interval"][1] - d if e["interval"] else 0.0 for d, e in zip(deltas, effects)]
    ax.bar(x, deltas, color=colors, yerr=[lower, upper], capsize=3)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(x, [_short(run.label) for run in runs], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"delta vs baseline\n({result.metric})", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    unit = "prompts" if result.readout == "needle" else "windows"
    fig.suptitle(
        f"{result.model} — {result.readout}: edits (red), random controls (gray)\n"
        f"bars: 95% interval over {len(result.baseline.units)} {unit}",
        fontsize=8,
    )
    return fig


def loss_figure(result):
    """Loss by position (running mean over `SMOOTH` positions) of the baseline and every edit, overlaid."""
    fig = _figure(7.5, 4.2)
    ax = fig.add_axes([0.1, 0.13, 0.62, 0.75])
    for run in [result.baseline, *result.runs]:
        curve = run.position_loss
        width = min(SMOOTH, len(curve))
        smooth = np.convolve(curve, np.ones(width) / width, mode="valid")
        positions = np.arange(len(smooth)) + 1 + (width - 1) / 2
        style = {"color": "black", "linewidth": 1.6} if run is result.baseline else {"linewidth": 1.0}
        ax.plot(positions, smooth, label=_short(run.label), **style)
    ax.set_xlabel("position of the predicted token")
    ax.set_ylabel(f"loss (nats), running mean of {SMOOTH}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(f"{result.model} — loss by position, {len(result.baseline.units)} windows", fontsize=9)
    return fig


def grid_figure(result):
    """The mean answer log-probability by length and depth: the baseline beside each edit."""
    runs = [result.baseline, *result.runs]
    grids = [run.grid[0] for run in runs]
    low = float(np.nanmin([np.nanmin(g) for g in grids]))
    fig = _figure(2.6 * len(runs) + 1.0, 3.2)
    lengths, depths = result.settings["lengths"], result.settings["depths"]
    image = None
    for k, (run, grid) in enumerate(zip(runs, grids)):
        ax = fig.add_axes([0.1 + k * (0.76 / len(runs)), 0.18, 0.76 / len(runs) - 0.05, 0.62])
        image = ax.imshow(grid, cmap="viridis", vmin=low, vmax=0.0, aspect="auto", origin="lower")
        ax.set_xticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        ax.set_yticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
        ax.set_xlabel("depth", fontsize=8)
        if k == 0:
            ax.set_ylabel("length (tokens)", fontsize=8)
        ax.set_title(_short(run.label), fontsize=8)
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=6, color="white" if v < low / 2 else "black")
    cax = fig.add_axes([0.88, 0.18, 0.015, 0.62])
    fig.colorbar(image, cax=cax)
    fig.suptitle(f"{result.model} — mean log p(answer), nats: baseline beside each edit", fontsize=9)
    return fig


def _short(label: str, width: int = 28) -> str:
    return label if len(label) <= width else label[: width - 3] + "..."
