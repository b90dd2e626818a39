"""Figures for `posprobe learned` in the papers' style: one panel per head per layer (TISA Fig. 3, composite
attention Fig. 2: learned function solid, initial dashed, a compared model dotted), a layer x offset heatmap
per head, the depthwise beta[k, c] heatmap per layer (composite attention Fig. 3), per-offset table norms,
and the CAT / conv-qkv filter taps. x axes are always k = j - i (positive = key to the right).

Functions return matplotlib Figures; `posprobe.pipelines.learned.write_learned` saves them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from posprobe.plotting.base import _figure


def _axes(fig, rows: int, cols: int, **space):
    h = fig.get_figheight()
    kw = dict(left=0.05, right=0.99, bottom=0.35 / h, top=1 - 0.6 / h, wspace=0.25, hspace=0.5) | space
    return fig.subplots(rows, cols, squeeze=False, gridspec_kw=kw)


def head_grid(offsets, curves: list[tuple[str, np.ndarray, dict]], title: str):
    """Rows = layers, columns = heads; each curve `(label, (L, H, K), line style)` drawn in every panel.

    Tick labels carry their own exponent ('2e-05'): matplotlib's shared offset text ('1e-5' above the axis) sat on
    the head titles. The legend is one row under the figure title, outside every panel (in panel L0 H0 it hid
    the curves and the 'layer 0' label)."""
    from matplotlib.ticker import FuncFormatter

    L, H = curves[0][1].shape[:2]
    height = 1.15 * L + 1.2
    fig = _figure(1.5 * H + 0.6, height)
    axes = _axes(fig, L, H, left=0.6 / (1.5 * H + 0.6), wspace=0.45, hspace=0.55, top=1 - 0.85 / height)
    compact = FuncFormatter(lambda v, _: f"{v:.2g}")
    for li in range(L):
        for h in range(H):
            ax = axes[li, h]
            for label, values, style in curves:
                ax.plot(offsets, values[li, h], label=label, **style)
            ax.axvline(0, color="grey", lw=0.4)
            ax.tick_params(labelsize=5, length=2)
            ax.yaxis.set_major_formatter(compact)
            if li == 0:
                ax.set_title(f"head {h}", fontsize=7)
            if h == 0:
                ax.set_ylabel(f"layer {li}", fontsize=7)
    fig.suptitle(title, fontsize=9, y=1 - 0.08 / height, va="top")
    if len(curves) > 1:
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.4 / height), ncol=len(curves),
                   fontsize=6, frameon=False)  # fmt: skip
    return fig


def _diverging(ax, matrix: np.ndarray, extent, limit: float):
    return ax.imshow(
        matrix, aspect="auto", cmap="RdBu_r", vmin=-limit, vmax=limit, extent=extent, interpolation="nearest"
    )


def _limit(values: np.ndarray) -> float:
    m = float(np.nanmax(np.abs(values))) if values.size else 0.0
    return m if m > 0 else 1.0


def layer_offset_heatmaps(offsets, values: np.ndarray, title: str):
    """One panel per head: an L x K heatmap (rows layers top to bottom, columns k). Each panel has its own
    symmetric colour scale (red > 0 > blue), its limit in the panel title, so weak heads still show shape."""
    L, H, _ = values.shape
    cols = min(H, 6)
    rows = -(-H // cols)
    fig = _figure(2.4 * cols + 0.4, 0.22 * L * rows + 0.9 * rows + 0.8)
    axes = _axes(fig, rows, cols, hspace=0.6)
    extent = (offsets[0] - 0.5, offsets[-1] + 0.5, L - 0.5, -0.5)
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        limit = _limit(values[:, h])
        _diverging(ax, values[:, h], extent, limit)
        ax.set_title(f"head {h} (±{limit:.2g})", fontsize=7)
        ax.tick_params(labelsize=5, length=2)
        ax.set_ylabel("layer", fontsize=6)
    fig.suptitle(title + " — colour: red > 0 > blue, scale per head", fontsize=9)
    return fig


def channel_heatmaps(offsets, values: np.ndarray, title: str, head_dim: int | None = None):
    """Depthwise `beta[k, c]`: one K x d panel per layer (rows k, columns channel c = h*d_h + e)."""
    L, K, d = values.shape
    cols = min(L, 3)
    rows = -(-L // cols)
    fig = _figure(4.2 * cols + 0.8, 2.6 * rows + 0.8)
    axes = _axes(fig, rows, cols, hspace=0.5)
    for li, ax in enumerate(axes.flat):
        if li >= L:
            ax.axis("off")
            continue
        limit = _limit(values[li])
        _diverging(ax, values[li], (-0.5, d - 0.5, offsets[-1] + 0.5, offsets[0] - 0.5), limit)
        if head_dim:
            for c in range(head_dim, d, head_dim):
                ax.axvline(c - 0.5, color="black", lw=0.3)
        ax.set_title(f"layer {li} (±{limit:.2g})", fontsize=7)
        ax.set_xlabel("channel c = h·d_h + e", fontsize=6)
        ax.set_ylabel("k", fontsize=6)
        ax.tick_params(labelsize=5, length=2)
    fig.suptitle(title + " — red > 0 > blue, scale per layer", fontsize=9)
    return fig


def filter_heatmaps(offsets, values: np.ndarray, title: str):
    """CAT / conv-qkv taps `(L, 3, d, K)`: rows layers, columns query/key/value; each a d x K heatmap."""
    L, _, d, _ = values.shape
    fig = _figure(9.0, 1.8 * L + 0.8)
    axes = _axes(fig, L, 3, hspace=0.45)
    for li in range(L):
        for r, role in enumerate(("query", "key", "value")):
            ax = axes[li, r]
            limit = _limit(values[li, r])
            _diverging(ax, values[li, r], (offsets[0] - 0.5, offsets[-1] + 0.5, d - 0.5, -0.5), limit)
            ax.set_title(f"layer {li}, {role} (±{limit:.2g})", fontsize=7)
            ax.set_ylabel("channel", fontsize=6)
            ax.tick_params(labelsize=5, length=2)
    fig.suptitle(title + " — red > 0 > blue, scale per panel", fontsize=9)
    return fig


def layer_lines(offsets, curves: list[tuple[str, np.ndarray, dict]], title: str):
    """Per-layer curves `(L, K)` (table norms per offset): one panel per layer."""
    L = curves[0][1].shape[0]
    cols = min(L, 6)
    rows = -(-L // cols)
    fig = _figure(2.2 * cols + 0.4, 1.7 * rows + 0.9)
    axes = _axes(fig, rows, cols)
    for li, ax in enumerate(axes.flat):
        if li >= L:
            ax.axis("off")
            continue
        for label, values, style in curves:
            ax.plot(offsets, values[li], label=label, **style)
        ax.axvline(0, color="grey", lw=0.4)
        ax.set_title(f"layer {li}", fontsize=7)
        ax.tick_params(labelsize=5, length=2)
    if len(curves) > 1:
        axes.flat[0].legend(fontsize=5)
    fig.suptitle(title, fontsize=9)
    return fig


_LEARNED = dict(color="C0", lw=1.2)
_INITIAL = dict(color="grey", lw=0.8, ls="--")
_OTHER = dict(color="C3", lw=1.0, ls=":")

_TITLES = {
    "functions": "score bias f_h(k) added to head h",
    "dynamic_scores": "dynamic: score of the average query q·w[k]/√d_h",
    "key_dynamic_scores": "key-dynamic: score of the average key k·u[−k]/√d_h",
    "shaw_values_scores": "Shaw values: a_V[k] along the head's average value",
    "dynamic_norms": "dynamic: ‖w[k]‖ per layer",
    "key_dynamic_norms": "key-dynamic: ‖u[−k]‖ per layer",
    "shaw_values_norms": "Shaw values: ‖a_V[k]‖ per layer",
    "depthwise": "depthwise β[k, c] per layer",
    "cat_filters": "CAT filter taps per channel",
    "conv_qkv_filters": "conv-qkv depthwise filter taps per channel",
}


def _short(folder: str) -> str:
    """The last three components of a folder path (enough for `run/seed-0/model`)."""
    return "/".join(Path(folder).parts[-3:])


def learned_figures(report) -> list[tuple[str, object]]:
    """(file stem, Figure) for every array of a `LearnedReport`."""
    learned = report.learned
    k = learned.offsets
    other = report.other.learned if report.other is not None else None
    figures = []
    for key in learned.learned_names:
        kind = learned.kind(key)
        what = _TITLES.get(key, key.replace("_", " "))
        title = f"{_short(report.model)} — {learned.mechanism}: {what} (x: k = j − i)"
        curves = [("learned", learned.arrays[key], _LEARNED)]
        if learned.initial(key) is not None:
            curves.append(("initial", learned.initial(key), _INITIAL))
        if other is not None and key in other.arrays:
            curves.append((f"compare: {_short(report.other.model)}", other.arrays[key], _OTHER))
        if kind == "head":
            figures.append((f"{key}_heads", head_grid(k, curves, title)))
            figures.append((f"{key}_heatmap", layer_offset_heatmaps(k, learned.arrays[key], title)))
            change = learned.change(key)
            if change is not None and np.any(change) and np.any(learned.initial(key)):  # else change == learned
                figures.append(
                    (f"{key}_change_heatmap", layer_offset_heatmaps(k, change, title + ", change from init"))
                )
        elif kind == "layer":
            figures.append((key, layer_lines(k, curves, title)))
        elif kind == "channels":
            figures.append((key, channel_heatmaps(k, learned.arrays[key], title)))
        else:
            figures.append((key, filter_heatmaps(k, learned.arrays[key], title)))
            change = learned.change(key)
            if change is not None and np.any(change):
                figures.append((f"{key}_change", filter_heatmaps(k, change, title + ", change from init")))
    return figures
