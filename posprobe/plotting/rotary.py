"""Figure of `posprobe rotary` (SPEC §15): band norm against wavelength (log x), one panel per layer.

Each panel: every query head's band norms (thin lines), their mean over heads (black) and the key heads' mean
(orange, dashed); the context marked: the model's maximum positions (red dotted) and, with texts, the longest
analysed text (green dashed), a layer's sliding window (purple), and the rotary budget's extrapolation limit (grey,
SPEC §17). Takes a `RotaryBandsResult`, returns a matplotlib Figure (no pyplot).
"""

from __future__ import annotations

import numpy as np

from posprobe.plotting.base import _figure, _grid, quantization_note, short_kind


def band_norm_figure(result):
    """One panel per analysed layer: band norm (y) against the band's wavelength in tokens (x, log scale); one
    legend for the figure, above the panels, with the context lengths marked."""
    from matplotlib.lines import Line2D

    count = len(result.layers)
    rows, cols = _grid(count)
    limit = result.budget["extrapolation_limit"] if result.budget else None
    windowed = any(w is not None for w in result.layer_windows or [])
    entries = 3 + bool(result.max_positions) + (result.texts is not None) + windowed + (limit is not None)
    legend_rows = -(-entries // 4)
    fig = _figure(3.0 * cols, 2.3 * rows + 0.95 + 0.2 * legend_rows)
    axes = fig.subplots(
        rows,
        cols,
        squeeze=False,
        gridspec_kw=dict(
            left=0.55 / fig.get_figwidth(),
            right=0.98,
            bottom=0.45 / fig.get_figheight(),
            top=1 - (0.85 + 0.2 * legend_rows) / fig.get_figheight(),
            wspace=0.3,
            hspace=0.55,
        ),  # fmt: skip
    )
    lengths = result.wavelengths
    for i, ax in enumerate(axes.flat):
        if i >= count:
            ax.axis("off")
            continue
        order = np.argsort(lengths[i])
        x = lengths[i][order]
        for head in result.q_band_norm[i]:
            ax.plot(x, head[order], color="tab:blue", lw=0.5, alpha=0.45)
        ax.plot(x, result.q_band_norm[i].mean(0)[order], color="black", lw=1.4)
        ax.plot(x, result.k_band_norm[i].mean(0)[order], color="tab:orange", lw=1.2, ls="--")
        if result.max_positions:
            ax.axvline(result.max_positions, color="tab:red", lw=0.9, ls=":")
        if result.texts is not None:
            ax.axvline(result.texts["longest_text"], color="tab:green", lw=0.9, ls="--")
        window = (result.layer_windows or [None] * count)[i]
        if window is not None:
            ax.axvline(result.layer_contexts[i], color="tab:purple", lw=0.9, ls="-.")
        if limit is not None:
            ax.axvline(limit, color="tab:gray", lw=1.0, ls=(0, (4, 1, 1, 1)))
        ax.set_xscale("log")
        kind = short_kind((result.layer_kinds or [None] * count)[i])  # 'local |k| <= 511, rope theta 10000', NoPE
        note = f" ({kind})" if kind and kind != "global" else "" if window is None else f" (window {window:,})"
        ax.set_title(f"layer {result.layers[i]}{note}", fontsize=8)
        ax.tick_params(labelsize=6)
        if i % cols == 0:
            ax.set_ylabel("band norm", fontsize=7)
        if i >= count - cols:
            ax.set_xlabel("wavelength (tokens)", fontsize=7)
    handles = [
        Line2D([], [], color="tab:blue", lw=0.5, alpha=0.6, label="each query head"),
        Line2D([], [], color="black", lw=1.4, label="queries, mean over heads"),
        Line2D([], [], color="tab:orange", lw=1.2, ls="--", label="keys, mean over key heads"),
    ]
    if result.max_positions:
        label = f"max positions ({result.max_positions:,})"
        handles.append(Line2D([], [], color="tab:red", lw=0.9, ls=":", label=label))
    if result.texts is not None:
        label = f"longest text ({result.texts['longest_text']:,} tokens)"
        handles.append(Line2D([], [], color="tab:green", lw=0.9, ls="--", label=label))
    if windowed:
        handles.append(Line2D([], [], color="tab:purple", lw=0.9, ls="-.", label="the layer's sliding window"))
    if limit is not None:
        b = result.budget
        label = f"extrapolation limit ({limit:,.0f}; critical dim {b['critical_dimension']} of {b['rotated_dims']})"
        handles.append(Line2D([], [], color="tab:gray", lw=1.0, ls=(0, (4, 1, 1, 1)), label=label))
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.55 / fig.get_figheight()),
               ncol=min(len(handles), 4), fontsize=7, frameon=False)  # fmt: skip
    what = "content-free input" if result.texts is None else f"{result.texts['n_texts']} texts, real tokens"
    partial = f"; partial rotary: {result.rotated_dims} of {result.head_dim} dims rotate" if result.partial else ""
    fig.suptitle(
        f"{result.model}{quantization_note(result)}: rotary band norms of queries and keys ({what}){partial}\n"
        f"bands {result.pairing}; wavelength 2π/θ_f after rope scaling",
        fontsize=9,
    )
    return fig
