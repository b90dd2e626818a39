"""Figures of `posprobe needle` (SPEC §18). Each takes a `NeedleResult` and returns a matplotlib Figure (no pyplot).

- `grid_figure`: length x depth heatmaps of accuracy (greedy exact match) and mean answer log-probability;
- `depth_figure`: accuracy and log-probability against the measured depth, one line per length, with the
  primacy / recency gaps in the legend;
- `heads_figure`: needle attention per layer and head (mean over prompts; the needle-attending heads), and the
  top heads against the uniform reference.
"""

from __future__ import annotations

import numpy as np

from posprobe.plotting.base import _figure, quantization_note


def _title(result) -> str:
    return f"{result.model}{quantization_note(result)} — needle in {result.haystack}, {result.trials} trials per cell"


def text_colour(rgba) -> str:
    """'white' or 'black', whichever reads better on a cell of colour `rgba`: black on a background whose relative
    luminance (WCAG, sRGB linearised) is above 0.179 (where the two contrasts are equal), else white. Dark text on
    the dark green and red ends of RdYlGn was hard to read (issue 49)."""
    channels = []
    for c in rgba[:3]:
        channels.append(c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4)
    luminance = 0.2126 * channels[0] + 0.7152 * channels[1] + 0.0722 * channels[2]
    return "black" if luminance > 0.179 else "white"


def _cells(fig, ax, values: np.ndarray, result, cmap: str, label: str, limits, fmt: str, notes=None) -> None:
    """A heatmap of `values` (Lg, D) with each cell's number, and under it `notes[i][j]` (its interval and n)."""
    import matplotlib

    image = ax.imshow(values, cmap=cmap, vmin=limits[0], vmax=limits[1], aspect="auto", origin="lower")
    ax.set_xticks(range(len(result.depths)), [f"{d:g}" for d in result.depths])
    ax.set_yticks(range(len(result.lengths)), [str(n) for n in result.lengths])
    ax.set_xlabel("depth (share of the haystack before the needle)")
    ax.set_ylabel("prompt length (tokens)")
    ax.set_title(label, fontsize=10)
    colours = matplotlib.colormaps[cmap]
    for (i, j), value in np.ndenumerate(values):
        if np.isfinite(value):
            shade = colours((value - limits[0]) / (limits[1] - limits[0]))
            words = format(value, fmt) + ("" if notes is None else "\n" + notes[i][j])
            ax.text(j, i, words, ha="center", va="center", fontsize=8 if notes is None else 7,
                    color=text_colour(shade), linespacing=1.1)  # fmt: skip
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)


def accuracy_notes(result) -> list[list[str]]:
    """Per cell: the Wilson 95 % interval of its accuracy and its number of prompts, e.g. '[21–94%] n=3'."""
    from posprobe.analysis.needle import cell_successes, wilson_interval

    successes, n = cell_successes(result.exact)
    low, high = wilson_interval(successes, n)
    return [[f"[{100 * low[i, j]:.0f}–{100 * high[i, j]:.0f}%]\nn={int(n[i, j])}" if n[i, j] else "n=0"
             for j in range(n.shape[1])] for i in range(n.shape[0])]  # fmt: skip


def log_prob_notes(result) -> list[list[str]]:
    """Per cell: the 95 % t interval of its mean log-probability over trials and its n ('n=1' alone: no interval)."""
    from scipy import stats

    values = np.asarray(result.log_prob, dtype=np.float64)
    notes = []
    for i in range(values.shape[0]):
        row = []
        for j in range(values.shape[1]):
            cell = values[i, j][np.isfinite(values[i, j])]
            if len(cell) < 2:
                row.append(f"n={len(cell)}")
                continue
            half = stats.t.ppf(0.975, len(cell) - 1) * cell.std(ddof=1) / np.sqrt(len(cell))
            row.append(f"±{half:.2f}\nn={len(cell)}")
        notes.append(row)
    return notes


def grid_figure(result):
    """Accuracy (left) and mean log-probability of the answer (right) per (length, depth), each cell with its 95 %
    interval over trials (Wilson for the accuracy, t for the log-probability) and its n."""
    fig = _figure(10.0, 0.75 * len(result.lengths) + 2.6)
    left, right = fig.subplots(1, 2, gridspec_kw=dict(left=0.09, right=0.95, bottom=0.2, top=0.8, wspace=0.3))
    _cells(fig, left, result.accuracy, result, "RdYlGn", "accuracy (greedy exact match)", (0.0, 1.0), ".0%",
           accuracy_notes(result))  # fmt: skip
    lp = result.mean_log_prob
    low = float(np.nanmin(lp)) if np.isfinite(lp).any() else -1.0
    _cells(fig, right, lp, result, "viridis", "mean log p(answer) (nats)", (min(low, -1e-3), 0.0), ".2f",
           log_prob_notes(result))  # fmt: skip
    fig.suptitle(_title(result) + "\ncells: value, 95 % interval over trials (accuracy: Wilson), n prompts",
                 fontsize=10)  # fmt: skip
    return fig


def depth_figure(result):
    """Accuracy and mean log-probability against the measured mean depth, one line per length."""
    fig = _figure(10.0, 3.6)
    left, right = fig.subplots(1, 2, gridspec_kw=dict(left=0.08, right=0.98, bottom=0.15, top=0.83, wspace=0.25))
    depth = np.nanmean(result.achieved_depth, axis=2)  # (Lg, D)
    for ax, values, of, label in (
        (left, result.accuracy, "accuracy", "accuracy"),
        (right, result.mean_log_prob, "log_prob", "mean log p(answer) (nats)"),
    ):
        first, last = result.gaps(of)
        for i, length in enumerate(result.lengths):
            gap = "" if not np.isfinite(first[i]) else f" (primacy {first[i]:+.2f}, recency {last[i]:+.2f})"
            ax.plot(depth[i], values[i], marker="o", label=f"{length} tokens{gap}")
        ax.set_xlabel("measured depth of the needle")
        ax.set_ylabel(label)
        ax.set_xlim(-0.03, 1.03)
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    left.set_ylim(-0.05, 1.05)
    fig.suptitle(_title(result) + "\ngap = first (or last) depth minus the mean of the middle depths", fontsize=9)
    return fig


def heads_figure(result, top: int = 10):
    """Mean needle attention per layer and head (left), and the `top` heads as bars with the uniform reference
    (right)."""
    attention = result.head_attention  # (L, H)
    fig = _figure(10.0, max(3.2, 0.16 * attention.shape[0] + 1.4))
    left, right = fig.subplots(
        1, 2, gridspec_kw=dict(left=0.08, right=0.97, bottom=0.14, top=0.84, wspace=0.35, width_ratios=[1.2, 1])
    )
    image = left.imshow(attention, cmap="magma", aspect="auto", origin="lower", vmin=0.0)
    from matplotlib.ticker import MaxNLocator

    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.yaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel("head")
    left.set_ylabel("layer")
    left.set_title("attention of the last prompt token on the needle", fontsize=9)
    fig.colorbar(image, ax=left, fraction=0.05, pad=0.03)
    heads = result.top_heads(top)
    names = [f"L{h['layer']}.H{h['head']}" for h in heads][::-1]
    values = [h["needle_attention"] or 0.0 for h in heads][::-1]
    right.barh(names, values, color="tab:purple")
    uniform = float(np.nanmean(result.uniform_share))
    right.axvline(uniform, color="gray", linestyle=":", label=f"uniform attention ({uniform:.3f})")
    right.set_xlabel("mean attention on the needle")
    right.set_title(f"top {len(heads)} needle-attending heads", fontsize=9)
    right.legend(fontsize=7, loc="lower right")
    right.tick_params(axis="y", labelsize=7)
    fig.suptitle(_title(result), fontsize=10)
    return fig
