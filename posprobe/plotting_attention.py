"""Figures of `posprobe attention`: per-layer profile grids and the heads x layers mean-distance chart.

Functions take an `AttentionResult` and return a matplotlib Figure (no pyplot); the output layer saves them.
"""

from __future__ import annotations

import numpy as np

from posprobe.plotting import _figure, _grid, quantization_note


def profile_grid(result, layer: int, window: int = 20):
    """One panel per head of `layer` over k = j - i in -window..window: the score profile s(k) (black, left
    axis), the probability profile a(k) (blue, right axis) and, where it exists, the weights-based profile
    (grey dashes) shifted and scaled to s(k)'s mean and spread over the window, so shapes can be compared."""
    p = result.profiles
    n = result.max_length
    w = max(1, min(int(window), n - 1))
    sl = slice(n - 1 - w, n + w)
    ks = p.offsets[sl]
    rows, cols = _grid(result.n_heads)
    fig = _figure(2.9 * cols, 2.3 * rows + 0.7)
    axes = fig.subplots(
        rows,
        cols,
        squeeze=False,
        gridspec_kw=dict(
            left=0.05,
            right=0.95,
            bottom=0.35 / fig.get_figheight(),
            top=1 - 0.65 / fig.get_figheight(),
            wspace=0.45,
            hspace=0.5,
        ),
    )
    for h, ax in enumerate(axes.flat):
        if h >= result.n_heads:
            ax.axis("off")
            continue
        s = p.score_profiles[layer, h, sl]
        ax.plot(ks, s, color="black", lw=1.5, label="score s(k)")
        if result.weights_profiles is not None:
            f = result.weights_profiles[layer, h, sl]
            ok = np.isfinite(s) & np.isfinite(f)
            if ok.sum() > 1 and np.std(f[ok]) > 0:
                scaled = (f - f[ok].mean()) / np.std(f[ok]) * np.std(s[ok]) + s[ok].mean()
                ax.plot(ks, scaled, color="grey", lw=1.0, ls="--", label="weights (rescaled)")
        twin = ax.twinx()
        twin.plot(ks, p.prob_profiles[layer, h, sl], color="tab:blue", lw=1.0, label="prob a(k)")
        twin.tick_params(labelsize=6, colors="tab:blue")
        ax.axvline(0, color="grey", lw=0.5)
        r = "" if result.weights_correlation is None else _r(result.weights_correlation[layer, h])
        ax.set_title(f"head {h}: dist {_f(p.mean_distance[layer, h])}{r}", fontsize=8)
        ax.tick_params(labelsize=6)
    axes.flat[0].legend(fontsize=5, loc="upper left")
    special = ", special tokens excluded" if result.exclude_special else ""
    fig.suptitle(
        f"{result.model}{quantization_note(result)}: empirical profiles, layer {layer} — {result.n_texts} texts, "
        f"max length {n}{special}\n"
        "x: k = j − i (positive = later key); black: mean score s(k); blue (right axis): mean probability a(k)",
        fontsize=9,
    )
    return fig


def _f(value: float) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:.2f}"


def _r(value: float) -> str:
    return ", r = n/a" if not np.isfinite(value) else f", r = {value:+.2f}"


def mean_distance_chart(result):
    """Mean attention distance (tokens) per head (rows) and layer (columns), with the value in each cell."""
    d = result.profiles.mean_distance.T  # (H, L)
    fig = _figure(1.0 + 0.75 * result.n_layers, 1.2 + 0.32 * result.n_heads)
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.15, right=0.88, top=1 - 0.75 / fig.get_figheight(), bottom=0.5 / fig.get_figheight())
    finite = d[np.isfinite(d)]
    vmax = float(finite.max()) if finite.size else 1.0
    image = ax.imshow(np.nan_to_num(d), cmap="viridis", vmin=0, vmax=vmax or 1.0, aspect="auto")
    for (h, layer), value in np.ndenumerate(d):
        colour = "white" if np.isfinite(value) and value < 0.6 * vmax else "black"
        ax.text(layer, h, _f(value), ha="center", va="center", fontsize=6, color=colour)
    ax.set_xticks(range(result.n_layers))
    ax.set_yticks(range(result.n_heads))
    ax.set_xlabel("layer", fontsize=8)
    ax.set_ylabel("head", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03).set_label("tokens", fontsize=7)
    ax.set_title(
        f"{result.model}{quantization_note(result)}: mean attention distance Σ_j A(i,j)|j − i|\n"
        f"{result.n_texts} texts, max length {result.max_length}",
        fontsize=8,
    )
    return fig
