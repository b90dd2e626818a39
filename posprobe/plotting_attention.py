"""Figures of `posprobe attention`: per-layer profile grids, the heads x layers mean-distance chart (with the
uniform-attention reference per layer) and the sink chart (first-token mass per head and layer, sink rate per layer).

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
    sinks = getattr(result, "sinks", None)
    if sinks is not None:  # the uniform-attention reference under each layer
        ax.set_xticklabels([f"{layer}\n({_f(u)})" for layer, u in enumerate(sinks.uniform_distance)])
    ax.set_yticks(range(result.n_heads))
    ax.set_xlabel(
        "layer" + ("  (in brackets: the distance of uniform attention)" if sinks is not None else ""), fontsize=8
    )
    ax.set_ylabel("head", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03).set_label("tokens", fontsize=7)
    ax.set_title(
        f"{result.model}{quantization_note(result)}: mean attention distance Σ_j A(i,j)|j − i|\n"
        f"{result.n_texts} texts, max length {result.max_length}",
        fontsize=8,
    )
    return fig


def sink_chart(result):
    """Attention sinks (SPEC §14): first-token mass per head (rows) and layer (columns), the value in each cell,
    and above it the sink rate of each layer (share of heads whose first-token mass exceeds the threshold)."""
    sinks = result.sinks
    mass = sinks.first_token_mass.T  # (H, L)
    L, H = result.n_layers, result.n_heads
    fig = _figure(1.0 + 0.75 * L, 2.2 + 0.32 * H)
    top = 1 - 0.75 / fig.get_figheight()
    bottom = 0.5 / fig.get_figheight()
    rate_height = 0.9 / fig.get_figheight()
    rate_ax = fig.add_axes((0.15, top - rate_height, 0.6, rate_height))
    ax = fig.add_axes((0.15, bottom, 0.6, top - rate_height - bottom - 0.25 / fig.get_figheight()))
    image = ax.imshow(np.nan_to_num(mass), cmap="magma", vmin=0, vmax=1, aspect="auto")
    for (h, layer), value in np.ndenumerate(mass):
        colour = "white" if np.isfinite(value) and value < 0.6 else "black"
        ax.text(layer, h, _f(value), ha="center", va="center", fontsize=6, color=colour)
    ax.set_xticks(range(L))
    ax.set_yticks(range(H))
    ax.set_xlabel("layer", fontsize=8)
    ax.set_ylabel("head", fontsize=8)
    ax.tick_params(labelsize=7)
    bar = fig.add_axes((0.8, bottom, 0.03, top - rate_height - bottom - 0.25 / fig.get_figheight()))
    fig.colorbar(image, cax=bar).set_label("first-token mass", fontsize=7)
    bar.tick_params(labelsize=6)
    rates = np.nan_to_num(sinks.sink_rate)
    rate_ax.bar(range(L), rates, color="tab:red", width=0.7)
    for layer, value in enumerate(sinks.sink_rate):
        rate_ax.text(layer, min(np.nan_to_num(value), 1.0) + 0.04, _f(value), ha="center", fontsize=6)
    rate_ax.set_xlim(-0.5, L - 0.5)
    rate_ax.set_ylim(0, 1.25)
    rate_ax.set_xticks([])
    rate_ax.set_yticks([0, 1])
    rate_ax.tick_params(labelsize=6)
    rate_ax.set_ylabel("sink rate", fontsize=7)
    rate_ax.set_title(
        f"{result.model}: attention on the first token, mean over queries i ≥ 1 — {result.n_texts} texts\n"
        f"sink rate: share of a layer's heads with first-token mass > {sinks.threshold:g}",
        fontsize=8,
    )
    return fig
