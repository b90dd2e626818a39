"""Figures of `posprobe context` (SPEC §17): loss by position per variant (raw points and a curve smoothed over
geometric position bins, log x) and perplexity by length per variant (log x); the trained length is marked on
both (the x axis reaches it, so a trained length past the lengths run is still drawn). Each function takes a
`ContextResult` and returns a matplotlib Figure (no pyplot)."""

from __future__ import annotations

import numpy as np

from posprobe.analysis.context_loss import log_smooth
from posprobe.plotting.base import _figure, quantization_note

_COLOURS = ("black", "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink")
_STYLES = ("-", "-", "--", "-.", ":", "-", "--", "-.")  # lines that coincide (dynamic below its length) stay visible


def _mark_trained(ax, result, right: float) -> None:
    """The trained length as a vertical line, the axis extended to it."""
    if result.trained_length is None:
        return
    ax.axvline(result.trained_length, color="grey", lw=1.0, ls=":",
               label=f"trained length ({result.trained_length:,})")  # fmt: skip
    ax.set_xlim(right=max(right, result.trained_length) * 1.25)


def windows_words(count: int) -> str:
    """'1 window', '4 windows'."""
    return f"{count} window" + ("" if count == 1 else "s")


def position_loss_figure(result):
    """Loss at position t (nats) against t + 1 (log x), one colour per variant; where the windows run past the
    trained length, that region on a panel of its own with a linear axis (on the log axis it was a sliver)."""
    length = result.position_loss.shape[1]
    trained = result.trained_length
    past = trained is not None and length + 1 > trained
    fig = _figure(10.5 if past else 7.0, 4.2)
    if past:
        ax, after = fig.subplots(1, 2, gridspec_kw=dict(width_ratios=[1.4, 1], wspace=0.22))
    else:
        ax, after = fig.add_subplot(1, 1, 1), None
    t = np.arange(length)
    curves = [log_smooth(loss) for loss in result.position_loss]
    for i, (name, loss) in enumerate(zip(result.variants, result.position_loss)):
        colour = _COLOURS[i % len(_COLOURS)]
        smooth_t, smooth = curves[i]
        for panel in (ax, after):
            if panel is None:
                continue
            panel.plot(t + 1, loss, ".", ms=1.2, color=colour, alpha=0.18, rasterized=True)
            panel.plot(smooth_t + 1, smooth, color=colour, lw=1.5, ls=_STYLES[i % len(_STYLES)], label=name)
    ax.set_xscale("log")
    ax.set_xlim(0.9, length * 1.1)
    _mark_trained(ax, result, length)
    smooth_all = np.concatenate([curve[1] for curve in curves])
    low, high = max(0.0, smooth_all.min() - 0.5), smooth_all.max() + 0.5
    ax.set_ylim(low, high)
    outside = dots_outside(result.position_loss, low, high)
    ax.set_xlabel("position t + 1 (tokens seen when predicting token t + 1)", fontsize=8)
    ax.set_ylabel("loss at position t (nats)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False, loc="upper right")
    if after is not None:
        start = max(1, int(trained * 0.9))
        after.set_xlim(start, length + 1)
        after.set_ylim(low, high)
        after.axvline(trained, color="grey", lw=1.0, ls=":")
        after.axvspan(trained, length + 1, color="tab:red", alpha=0.06, lw=0)
        after.set_title(f"past the trained length ({trained:,}), linear axis", fontsize=8)
        after.set_xlabel("position t + 1", fontsize=8)
        after.tick_params(labelsize=7)
    windows = int(result.windows[-1])
    fig.suptitle(
        f"{result.model}{quantization_note(result)}: loss by position, {windows_words(windows)} of {length + 1:,} "
        f"tokens ({result.text.get('source') or 'documents'})\n"
        "dots: each position (mean over windows); lines: mean over geometric position bins"
        + (f"\n{outside[0]:,} of {outside[1]:,} dots lie outside the y axis (not drawn)" if outside[0] else ""),
        fontsize=9,
    )
    top = (0.82 if outside[0] else 0.86) - (0.05 if past else 0.0)  # room for the second panel's title
    fig.subplots_adjust(left=0.07 if past else 0.09, right=0.98, bottom=0.12, top=top)
    return fig


def dots_outside(loss: np.ndarray, low: float, high: float) -> tuple[int, int]:
    """(dots outside [low, high], dots) of the per-position losses (V, L-1) the figure draws."""
    values = np.asarray(loss, dtype=np.float64)
    return int(((values < low) | (values > high)).sum()), int(values.size)


def _scored_line(result) -> str:
    """The perplexity figure's subtitle: which tokens were scored, and the windows per length."""
    counts = sorted({int(x) for x in result.tokens})
    scored = (
        f"the same {counts[0]:,} tokens scored at every length"
        if len(counts) == 1
        else "tokens scored: " + ", ".join(f"{n:,}: {int(x):,}" for n, x in zip(result.lengths, result.tokens))
    )
    left = result.text.get("window_starts_left_out") or 0
    if left:
        scored += f" ({left:,} window starts left out: no BOS)"
    windows = ", ".join(f"{windows_words(int(w))} of {n:,}" for n, w in zip(result.lengths, result.windows))
    return f"{scored}\nper length: {windows}"


def perplexity_figure(result):
    """Perplexity against window length (log x), one line per variant, with its 95 % interval over the windows."""
    fig = _figure(6.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    intervals = result.perplexity_interval
    for i, (name, row) in enumerate(zip(result.variants, result.perplexity)):
        style, colour = _STYLES[i % len(_STYLES)], _COLOURS[i % len(_COLOURS)]
        ax.plot(result.lengths, row, marker="o", ls=style, color=colour, lw=1.3, ms=4, label=name)
        if intervals is not None and np.isfinite(intervals[i]).any():  # 95 % over the windows (none with one)
            low, high = intervals[i][:, 0], intervals[i][:, 1]
            ax.errorbar(result.lengths, row, yerr=[np.maximum(row - low, 0), np.maximum(high - row, 0)], fmt="none",
                        ecolor=colour, elinewidth=1.0, capsize=3, alpha=0.8)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks(result.lengths, [f"{n:,}" for n in result.lengths])
    ax.minorticks_off()
    ax.set_xlim(result.lengths[0] / 1.3, result.lengths[-1] * 1.3)
    _mark_trained(ax, result, result.lengths[-1] * 1.3)
    ax.set_xlabel("window length (tokens)", fontsize=8)
    ax.set_ylabel("perplexity", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False)
    fig.suptitle(
        f"{result.model}{quantization_note(result)}: perplexity by window length (bars: 95 % over windows)\n"
        f"{_scored_line(result)}",
        fontsize=9,
    )
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.13, top=0.82)
    return fig
