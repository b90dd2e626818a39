"""Figures of `posprobe states` (SPEC §16): the summary (probe R² and control per hidden state, positional-vector
norms per position, massive activations per hidden state), the positional vectors' Gram matrices V V^T of a few
hidden states (the P heatmap of the TISA paper's Fig. 1, at depth), and a checkpoint series (each number against
the training step).

Functions take a `StatesResult` / `StatesSeries` and return a matplotlib Figure (no pyplot); the output layer saves
them. Line charts and at most four pooled heatmaps: drawing stays cheap next to the run.
"""

from __future__ import annotations

import numpy as np

from posprobe.analysis.position_probe import baseline_words
from posprobe.analysis.toeplitz import format_r2
from posprobe.plotting.base import _figure, _matrix_panel, _symmetric_limit, layer_kinds_line, quantization_note


def spread_layers(n_states: int, count: int) -> list[int]:
    """Up to `count` hidden states spread evenly over 0..n_states-1, first and last included."""
    return sorted({int(round(x)) for x in np.linspace(0, n_states - 1, min(count, n_states))})


def _r2_axis(ax, *series: np.ndarray) -> None:
    values = np.concatenate([np.asarray(s, dtype=float)[np.isfinite(s)] for s in series] + [np.zeros(1)])
    ax.set_ylim(max(-1.0, min(-0.05, values.min() - 0.05)), 1.05)
    ax.axhline(0, color="grey", lw=0.5)


def states_summary(result):
    """Three panels: held-out probe R² per hidden state with the permuted-position control (MAE on the right
    axis); positional-vector norms |v_l(i)| per position for a few hidden states; the largest and the median
    |activation| per hidden state (log scale; filled where the largest sits at position 0)."""
    fig = _figure(14.0, 4.2)
    axes = fig.subplots(1, 3, gridspec_kw=dict(left=0.05, right=0.96, bottom=0.13, top=0.84, wspace=0.38))
    layers = np.arange(result.n_states)
    p, v, m = result.probes, result.vectors, result.massive

    ax = axes[0]
    ax.set_xlabel("hidden state l (0 = embedding output)")
    ax.set_ylabel("held-out R²")
    ax.set_title(f"position probe: ridge, {len(p.fold_tokens)} folds by text", fontsize=9)
    if np.isfinite(p.r2).any():
        ax.plot(layers, p.r2, "o-", color="black", ms=3, lw=1.3, label="probe R² (held out)")
        draws = 0 if p.r2_controls is None else p.r2_controls.shape[1]
        ax.plot(layers, p.r2_control, "s--", color="tab:orange", ms=3, lw=1.0,
                label=f"control (permuted positions, mean of {draws})")  # fmt: skip
        if p.r2_control_std is not None and np.isfinite(p.r2_control_std).any():
            lo, hi = p.r2_control - 2 * p.r2_control_std, p.r2_control + 2 * p.r2_control_std
            ax.fill_between(layers, lo, hi, color="tab:orange", alpha=0.2, lw=0, label="control ± 2 sd")
        if np.isfinite(p.r2_baseline):
            ax.axhline(p.r2_baseline, color="tab:green", lw=1.0, ls="-.",
                       label=f"baseline, no hidden state: {baseline_words(p.baseline_inputs)} "
                             f"({p.r2_baseline:.2f})")  # fmt: skip
        _r2_axis(ax, p.r2, p.r2_control, np.array([p.r2_baseline]))
        twin = ax.twinx()
        twin.plot(layers, p.mae, ":", color="tab:blue", lw=1.0, label="MAE (positions)")
        twin.tick_params(labelsize=7, colors="tab:blue")
        twin.set_ylabel("mean absolute error (positions)", fontsize=8, color="tab:blue")
        ax.legend(fontsize=6.5, loc="lower right")
    else:  # fewer texts than folds: nothing was held out
        _r2_axis(ax, p.r2)
        ax.set_xlim(-0.5, result.n_states - 0.5)
        message = f"probe undefined: {result.n_texts} texts leave\none of its {len(p.fold_tokens)} folds without a text"
        ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize=9)

    ax = axes[1]
    positions = np.nonzero(v.kept)[0]
    if positions.size:
        colours = _depth_colours(result.n_states)
        for layer in spread_layers(result.n_states, 6):
            ax.plot(positions, v.norms[layer, positions], color=colours[layer], lw=1.2, label=f"l = {layer}")
            ax.plot(positions, v.norms_without_first[layer, positions], color=colours[layer], lw=0.8, ls="--")
            if v.within_noise is not None:  # sampling alone would give norms this large
                noisy = positions[v.within_noise[layer, positions]]
                ax.plot(noisy, v.norms[layer, noisy], "x", color=colours[layer], ms=4, mew=0.9)
                noisy = positions[v.within_noise_without_first[layer, positions]]
                ax.plot(noisy, v.norms_without_first[layer, noisy], "x", color=colours[layer], ms=4, mew=0.9)
        _log_if_wide(ax, v.norms[:, positions])
        title = "dashed: centred over i ≥ 1" + ("\n×: within 2 noise floors" if v.within_noise is not None else "")
        ax.legend(fontsize=7, ncol=2, title=title, title_fontsize=7)
    else:
        ax.text(0.5, 0.5, f"no position has {v.min_texts} texts", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("position i")
    ax.set_ylabel("|v_l(i)|")
    ax.set_title(f"positional-vector norms ({v.n_kept} positions with ≥ {v.min_texts} texts)", fontsize=9)

    ax = axes[2]
    ax.plot(layers, m.max, "-", color="tab:red", lw=1.2, label="largest |h|")
    first = m.position == 0
    ax.plot(layers[first], m.max[first], "o", color="tab:red", ms=4, label="… at position 0")
    ax.plot(layers[~first], m.max[~first], "o", mfc="white", color="tab:red", ms=4, label="… elsewhere")
    ax.plot(layers, m.median, "-", color="grey", lw=1.0, label="median |h|")
    _log_if_wide(ax, np.concatenate([m.max, m.median]))
    ax.set_xlabel("hidden state l")
    ax.set_ylabel("|activation|")
    peak = int(np.nanargmax(m.ratio)) if np.isfinite(m.ratio).any() else 0
    ax.set_title(f"massive activations: largest / median up to {_num(m.ratio[peak])} (l = {peak})", fontsize=9)
    ax.legend(fontsize=7)
    for ax in axes:
        ax.tick_params(labelsize=7)
        _whole_number_ticks(ax.xaxis)
    fig.suptitle(
        f"{result.model}{quantization_note(result)}: position in the hidden states — {result.n_texts} texts, "
        f"max length {result.max_length}{_kinds(result)}",
        fontsize=10,
    )
    return fig


def _kinds(result) -> str:
    """The layer kinds line of a hybrid's or a mixed model's titles (hidden state l + 1 is layer l's output)."""
    line = layer_kinds_line(getattr(result, "layer_kinds", None))
    return line.replace("layer kinds:", "layer kinds (hidden state l + 1 is layer l's output):", 1)


def gram_panels(result, count: int = 4):
    """V V^T (positions x positions) of up to `count` hidden states spread over depth, each on its own diverging
    scale centred on 0, titled with its Toeplitz R²."""
    v = result.vectors
    layers = spread_layers(result.n_states, count)
    fig = _figure(3.4 * len(layers), 6.3)
    grid = dict(left=0.05, right=0.95, bottom=0.07, top=0.88, wspace=0.5, hspace=0.45)
    axes = fig.subplots(2, len(layers), squeeze=False, gridspec_kw=grid)
    numbers = result.per_layer()
    rows = (
        (v.gram, v.toeplitz_r2, 0, "V Vᵀ", "positional_toeplitz_r2"),
        (v.gram_without_first, v.toeplitz_r2_without_first, 1, "i ≥ 1", "positional_toeplitz_r2_without_first"),
    )
    saturated = False
    for row, (grams, r2, first, what, name) in zip(axes, rows):
        for ax, layer in zip(row, layers):
            gram = grams[layer]
            if gram.shape[-1] == 0:
                ax.axis("off")
                continue
            n = gram.shape[-1]
            limit = _symmetric_limit(gram)
            if first == 0 and n > 2:  # a first token far larger than the rest would leave every other entry blank
                rest = _symmetric_limit(gram[1:, 1:])
                if 0 < rest < limit / 4:
                    limit, saturated = rest, True
            _matrix_panel(fig, ax, gram, limit, label="⟨v_i, v_j⟩")
            ax.images[0].set_extent((first - 0.5, first + n - 0.5, first + n - 0.5, first - 0.5))
            later = v.norms_without_first[layer][np.isfinite(v.norms_without_first[layer])]
            if first == 0 and later.size and v.norms[layer, 0] > 10 * np.median(later):
                box = dict(facecolor="white", alpha=0.85, lw=0)
                ax.text(0.5, 0.5, "position 0 dominates V Vᵀ:\nread the row below", transform=ax.transAxes,
                        ha="center", va="center", fontsize=7.5, bbox=box)  # fmt: skip
            mean, sd = numbers[f"{name}_null_mean"][layer], numbers[f"{name}_null_std"][layer]
            null = "" if not np.isfinite(mean) else f"\nnull {mean:.2f}" + (f" ± {sd:.2f}" if np.isfinite(sd) else "")
            ax.set_title(f"l = {layer}, {what}: R² = {format_r2(r2[layer], 3)}{null}", fontsize=8)
            ax.set_xlabel("position j", fontsize=7)
            ax.set_ylabel("position i", fontsize=7)
            ax.tick_params(labelsize=6)
            _whole_number_ticks(ax.xaxis, ax.yaxis)
    fig.suptitle(
        f"{result.model}{quantization_note(result)}: positional vectors' Gram matrix V Vᵀ ({v.n_kept} positions with "
        f"≥ {v.min_texts} texts; R²: Toeplitz R²; null: the same with positions 1.. permuted within each text)\n"
        "bottom: the vectors centred over positions i ≥ 1 (the first token apart)"
        + ("; top: colours scaled to positions ≥ 1, position 0's row and column saturate" if saturated else "")
        + _kinds(result),
        fontsize=9,
    )
    return fig


def series_chart(series):
    """Four panels against the training step, one line per hidden state (colour = depth): probe R² (and the
    control, dashed), the Gram matrices' Toeplitz R² (and without the first token, dashed), the mean
    positional-vector norm, the massive ratio."""
    fig = _figure(14.0, 4.0)
    axes = fig.subplots(1, 4, gridspec_kw=dict(left=0.05, right=0.9, bottom=0.15, top=0.8, wspace=0.35))
    steps = np.asarray(series.steps, dtype=float)
    colours = _depth_colours(series.n_states)
    panels = [
        ("probe_r2", "held-out probe R² (control dashed)", False),
        ("positional_toeplitz_r2", "Toeplitz R² of V Vᵀ (dashed: i ≥ 1)", False),
        ("positional_norm_mean", "mean |v_l(i)| over positions", True),
        ("massive_ratio", "largest / median |activation|", True),
    ]
    for ax, (name, title, log) in zip(axes, panels):
        values = series.numbers[name]  # (C, L+1)
        for layer in range(series.n_states):
            ax.plot(steps, values[:, layer], "o-", color=colours[layer], ms=2.5, lw=1.0)
            dashed = {"probe_r2": "probe_r2_control", "positional_toeplitz_r2": "positional_toeplitz_r2_without_first"}
            if name in dashed:
                ax.plot(steps, series.numbers[dashed[name]][:, layer], "--", color=colours[layer], lw=0.7)
        if log:
            _log_if_wide(ax, values)
        elif name == "probe_r2":
            _r2_axis(ax, values, series.numbers["probe_r2_control"])
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(series.step_label, fontsize=8)
        ax.tick_params(labelsize=7)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    bar = fig.colorbar(
        ScalarMappable(Normalize(0, series.n_states - 1), _DEPTH), ax=list(axes), fraction=0.015, pad=0.02
    )
    bar.set_label("hidden state l", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    fig.suptitle(f"{series.title}: position in the hidden states over {len(steps)} checkpoints", fontsize=10)
    return fig


_DEPTH = "viridis"


def _whole_number_ticks(*axes) -> None:
    """Ticks at whole numbers only: positions and hidden-state indices have no halves."""
    from matplotlib.ticker import MaxNLocator

    for axis in axes:
        axis.set_major_locator(MaxNLocator(integer=True))


def _log_if_wide(ax, values: np.ndarray) -> None:
    """A log y axis when the positive values span more than a factor of 20 (else linear, easier to read)."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite) & (finite > 0)]
    if finite.size and finite.max() / finite.min() > 20:
        ax.set_yscale("log")


def _depth_colours(n_states: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps[_DEPTH]
    return [cmap(x) for x in np.linspace(0, 1, max(n_states, 2))]


def _num(value: float) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
