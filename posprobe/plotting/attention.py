"""Figures of `posprobe attention`: per-layer profile grids, the heads x layers mean-distance chart (with the
uniform-attention reference per layer), the sink chart (first-token mass per head and layer, sink rate per layer)
and, for models with learned sink logits (gpt-oss), the learned-sink chart (the sink's own share per head and layer).

Functions take an `AttentionResult` and return a matplotlib Figure (no pyplot); the output layer saves them.
"""

from __future__ import annotations

import numpy as np

from posprobe.analysis.sinks import per_layer
from posprobe.plotting.base import _figure, layer_kind_note, quantization_note


def attention_pages(result, window: int = 20):
    """The profile pages of an `AttentionResult` (`plotting_profiles.ProfilePages`, drawn once and redrawn per
    layer): one page per layer, one panel per head over k = j - i in -window..window (a causal model's -window..0:
    it has no pairs at k > 0) with the score profile s(k) (black, its scale on the left), the probability profile
    a(k) (blue, its scale on the right), a(k) without the first token (orange dots, pairs with i, j >= 1, same scale:
    where a first-token sink pools into every offset, the two differ) and, where it exists, the weights-based
    profile (grey dashes) shifted and scaled to s(k)'s mean and spread over the window, so shapes can be compared.
    Panel titles: the head's mean attention distance and the Pearson r of s(k) and the weights-based profile."""
    from posprobe.plotting.profiles import ProfilePages

    p = result.profiles
    n = result.max_length
    w = max(1, min(int(window), n - 1))
    causal = bool(getattr(result, "causal", False))
    sl = slice(n - 1 - w, n if causal else n + w)
    scores = p.score_profiles[:, :, sl]
    guides = None
    if result.weights_profiles is not None:
        guides = np.full(scores.shape, np.nan)
        for layer, h in np.ndindex(scores.shape[:2]):
            s, f = scores[layer, h], result.weights_profiles[layer, h, sl]
            ok = np.isfinite(s) & np.isfinite(f)
            if ok.sum() > 1 and np.std(f[ok]) > 0:
                guides[layer, h] = (f - f[ok].mean()) / np.std(f[ok]) * np.std(s[ok]) + s[ok].mean()
    present = _present(result)
    titles = [
        [
            f"head {h}: dist {_f(p.mean_distance[layer, h])}"
            + ("" if result.weights_correlation is None else _r(result.weights_correlation[layer, h]))
            if present[layer, h]
            else f"head {h}: no such head"  # the layer has fewer query heads than the model's most (SPEC §9)
            for h in range(result.n_heads)
        ]
        for layer in range(result.n_layers)
    ]
    special = ", special tokens excluded" if result.exclude_special else ""
    side = "; causal: no pairs at k > 0" if causal else ""
    r_note = "" if result.weights_correlation is None else "; r: Pearson r of s(k) and the weights-based profile"
    kinds = getattr(result, "layer_kinds", None) or [None] * result.n_layers
    page_titles = [
        f"{result.model}{quantization_note(result)}: empirical profiles, layer {layer}{layer_kind_note(kind)} — "
        f"{result.n_texts} texts, max length {n}{special}\nx: k = j − i (positive = later key){side}; dist: mean "
        f"attention distance{r_note}"
        for layer, kind in zip(range(result.n_layers), kinds, strict=True)
    ]
    labels = {
        "profile": "mean score s(k) (left scale)",
        "overlay": "mean probability a(k) (right scale)",
        "second": "a(k) without key 0 / query 0 (right scale)",
        "sparse": f"fewer than {result.min_pairs} pairs (not in r)",
        "guide": "weights-based profile (input e_w), rescaled to s(k)",
    }
    without_first = None if p.prob_profiles_without_first is None else p.prob_profiles_without_first[:, :, sl]
    return ProfilePages(p.offsets[sl], scores, page_titles=page_titles, panel_titles=titles,
                        overlays=p.prob_profiles[:, :, sl], guides=guides, labels=labels,
                        second_overlays=without_first,
                        sparse=p.pair_counts[:, sl] < result.min_pairs)  # fmt: skip


def profile_grid(result, layer: int, window: int = 20):
    """Layer `layer`'s profile page (see `attention_pages`) as a matplotlib Figure."""
    return attention_pages(result, window).figure(layer)


def _f(value: float) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:.2f}"


def _r(value: float) -> str:
    return ", r = n/a" if not np.isfinite(value) else f", r = {value:+.2f}"


def mean_distance_chart(result):
    """Mean attention distance (tokens) per head (rows) and layer (columns), with the value in each cell."""
    d = result.profiles.mean_distance.T  # (H, L)
    fig = _figure(2.3 + 0.6 * result.n_layers, 1.2 + 0.32 * result.n_heads)
    ax, bar = _heatmap_axes(fig, top=0.75, bottom=0.5)
    finite = d[np.isfinite(d)]
    vmax = float(finite.max()) if finite.size else 1.0
    image = _cells(ax, result, d, "viridis", vmax)
    ax.set_xticks(range(result.n_layers))
    sinks = getattr(result, "sinks", None)
    label = "layer"
    if sinks is not None:  # the uniform-attention reference: once if every layer has the same (a causal model's)
        uniform = np.asarray(per_layer(sinks.uniform_distance), dtype=float)  # kept per head: the mean over heads
        if np.isfinite(uniform).all() and np.ptp(uniform) <= 1e-9 * max(1.0, abs(uniform[0])):
            label += f"  (uniform attention would give {_f(uniform[0])} in every layer)"
        else:
            ax.set_xticklabels([f"{layer}\n({_f(u)})" for layer, u in enumerate(uniform)])
            label += "  (in brackets: the distance of uniform attention)"
    ax.set_yticks(range(result.n_heads))
    ax.set_xlabel(label, fontsize=8)
    ax.set_ylabel("head", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.colorbar(image, cax=bar).set_label("tokens", fontsize=7)
    bar.tick_params(labelsize=6)
    ax.set_title(
        f"{result.model}{quantization_note(result)}: mean attention distance Σ_j A(i,j)|j − i|\n"
        f"{result.n_texts} texts, max length {result.max_length}",
        fontsize=8,
    )
    return fig


def other_layers(result) -> list[int]:
    """A hybrid's layers without softmax attention (`layer_kinds` says 'no positional score'); [] otherwise."""
    from posprobe.families.windows import NO_SCORE

    return [layer for layer, kind in enumerate(getattr(result, "layer_kinds", None) or []) if NO_SCORE in kind]


def _present(result) -> np.ndarray:
    """(L, H) bool: the heads each layer has (`AttentionResult.present_heads`; every head for results without it)."""
    present = getattr(result, "present_heads", None)
    return np.ones((result.n_layers, result.n_heads), dtype=bool) if present is None else present


def _cells(ax, result, values: np.ndarray, cmap: str, vmax: float):
    """A heads x layers chart's image: `values` (H, L) on 0..`vmax` (NaN drawn as 0), each cell labelled with its
    value (white on the dark lower part of the scale), a hybrid's layers without attention greyed out instead, and
    a head its layer does not have (SPEC §9, Laguna) greyed and labelled '—' (no such head)."""
    from matplotlib.patches import Rectangle

    image = ax.imshow(np.nan_to_num(values), cmap=cmap, vmin=0, vmax=vmax or 1.0, aspect="auto")
    others = _mark_other_layers(ax, result)
    present = _present(result)
    for (h, layer), value in np.ndenumerate(values):
        if layer in others:
            continue
        if not present[layer, h]:
            ax.add_patch(Rectangle((layer - 0.5, h - 0.5), 1, 1, color="0.85", zorder=2))
            ax.text(layer, h, "—", ha="center", va="center", fontsize=6, color="0.25", zorder=3)
            continue
        colour = "white" if np.isfinite(value) and value < 0.6 * vmax else "black"
        ax.text(layer, h, _f(value), ha="center", va="center", fontsize=6, color=colour)
    return image


def _mark_other_layers(ax, result) -> list[int]:
    """Grey out the columns of a heads x layers chart that belong to a hybrid's layers without softmax attention,
    labelled 'no softmax attention: no positional score' (their values are NaN); returns those layers."""
    from posprobe.families.windows import NO_SCORE

    others = other_layers(result)
    for layer in others:
        ax.axvspan(layer - 0.5, layer + 0.5, color="0.85", zorder=2)
        ax.text(layer, (result.n_heads - 1) / 2, f"no softmax attention:\n{NO_SCORE}", rotation=90, ha="center",
                va="center", fontsize=5.5, color="0.25", zorder=3)  # fmt: skip
    return others


def _heatmap_axes(fig, top: float, bottom: float):
    """The axes of a heads x layers chart and of its colour bar, with margins fixed in inches (`top`, `bottom`
    and the sides), so a wide chart of many layers gets no wide empty bands beside it."""
    width, height = fig.get_figwidth(), fig.get_figheight()
    left, right = 0.6, 1.0  # head labels; colour bar, its ticks and label
    y0, y1 = bottom / height, 1 - top / height
    ax = fig.add_axes((left / width, y0, (width - left - right) / width, y1 - y0))
    bar = fig.add_axes(((width - right + 0.15) / width, y0, 0.15 / width, y1 - y0))
    return ax, bar


def sink_chart(result):
    """Attention sinks (SPEC §14): first-token mass per head (rows) and layer (columns), the value in each cell,
    and above it the sink rate of each layer (share of heads whose first-token mass exceeds the threshold)."""
    sinks = result.sinks
    mass = sinks.first_token_mass.T  # (H, L)
    L, H = result.n_layers, result.n_heads
    fig = _figure(2.3 + 0.6 * L, 2.2 + 0.32 * H)
    ax, bar = _heatmap_axes(fig, top=0.75 + 0.9 + 0.25, bottom=0.5)
    left, width = ax.get_position().x0, ax.get_position().width
    rate_height = 0.9 / fig.get_figheight()
    rate_ax = fig.add_axes((left, 1 - 0.75 / fig.get_figheight() - rate_height, width, rate_height))
    image = _cells(ax, result, mass, "magma", 1.0)
    others = other_layers(result)
    ax.set_xticks(range(L))
    ax.set_yticks(range(H))
    label = "layer"
    uniform = per_layer(sinks.uniform_first_token_mass)  # kept per head: the mean over heads
    if uniform is not None:  # the reference: what uniform attention puts on the first token
        uniform = np.asarray(uniform, dtype=float)
        if np.isfinite(uniform).all() and np.ptp(uniform) <= 1e-9:
            label += f"  (uniform attention: {_f(uniform[0])} on the first token)"
        else:
            ax.set_xticklabels([f"{layer}\n({_f(u)})" for layer, u in enumerate(uniform)])
            label += "  (in brackets: uniform attention's)"
    ax.set_xlabel(label, fontsize=8)
    ax.set_ylabel("head", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.colorbar(image, cax=bar).set_label("first-token mass", fontsize=7)
    bar.tick_params(labelsize=6)
    rates = np.nan_to_num(sinks.sink_rate)
    rate_ax.bar(range(L), rates, color="tab:red", width=0.7)
    for layer, value in enumerate(sinks.sink_rate):
        if layer in others:
            continue
        rate_ax.text(layer, min(np.nan_to_num(value), 1.0) + 0.04, _f(value), ha="center", fontsize=6)
    rate_ax.set_xlim(-0.5, L - 0.5)
    rate_ax.set_ylim(0, 1.25)
    rate_ax.set_xticks([])
    rate_ax.set_yticks([0, 1])
    rate_ax.tick_params(labelsize=6)
    rate_ax.set_ylabel("sink rate", fontsize=7)
    rate_ax.set_title(
        f"{result.model}{quantization_note(result)}: attention on the first token, mean over queries i ≥ 1 that see "
        f"it — {result.n_texts} texts\n"
        f"sink rate: share of a layer's heads with first-token mass > {sinks.threshold:g}",
        fontsize=8,
    )
    return fig


def learned_sink_chart(result):
    """Learned sinks (gpt-oss): the mean share of each query's attention that the sink logit takes, per head (rows)
    and layer (columns), the value in each cell; real tokens get the rest (`LearnedSinkShares.real_token_share`)."""
    shares = result.learned_sinks
    share = shares.learned_sink_share.T  # (H, L)
    L, H = result.n_layers, result.n_heads
    fig = _figure(max(5.5, 2.3 + 0.6 * L), 1.2 + 0.32 * H)  # wide enough for the title's two lines
    ax, bar = _heatmap_axes(fig, top=0.75, bottom=0.5)
    image = _cells(ax, result, share, "cividis", 1.0)
    ax.set_xticks(range(L))
    ax.set_yticks(range(H))
    ax.set_xlabel("layer", fontsize=8)
    ax.set_ylabel("head", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.colorbar(image, cax=bar).set_label("sink's share", fontsize=7)
    bar.tick_params(labelsize=6)
    ax.set_title(
        f"{result.model}{quantization_note(result)}: learned sinks\nthe sink logit's mean share of a query's "
        f"attention ({shares.n_queries} queries); real tokens get 1 − share",
        fontsize=8,
    )
    return fig
