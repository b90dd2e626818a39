"""Figures for the position analyses. Every function takes results and returns a matplotlib Figure;
only the output layer saves them. matplotlib is imported lazily (Agg backend, no screen needed)."""

from __future__ import annotations

import math

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(count: int) -> tuple[int, int]:
    cols = min(count, 4 if count <= 8 else 6)
    return math.ceil(count / cols), cols


def _robust_limits(matrix: np.ndarray) -> tuple[float, float]:
    """Colour limits at the 1st and 99th percentiles, so one outlying entry (often position 0) does not
    wash out the whole image; the numbers printed by posprobe always use the full matrix."""
    lo, hi = np.percentile(matrix, [1, 99])
    return (float(lo), float(hi)) if hi > lo else (float(matrix.min()), float(matrix.max()) + 1e-12)


def heatmap(result, ax=None):
    """P = E_P E_P^T as an image (row i down, column j right), title with the Toeplitz R^2."""
    plt = _plt()
    fig = ax.figure if ax is not None else plt.figure(figsize=(5.2, 4.6))
    ax = ax or fig.add_subplot()
    lo, hi = _robust_limits(result.matrix)
    image = ax.imshow(result.matrix, cmap="Reds", interpolation="nearest", vmin=lo, vmax=hi)
    kind = "cosine" if result.cosine else "inner product"
    blocks = "".join(f", first {b}: {r:.3f}" for b, r in result.blocks.items())
    ax.set_title(f"{result.model}\nP = E_P E_P^T ({kind}); Toeplitz R² = {result.toeplitz_r2:.3f}{blocks}", fontsize=9)
    ax.set_xlabel("position j")
    ax.set_ylabel("position i")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return fig


def fhat_grid(result):
    """One F_hat_P image per head of a layer (paper Fig. 8), R^2 in each title."""
    plt = _plt()
    rows, cols = _grid(result.n_heads)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.9 * rows + 0.6), squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= result.n_heads:
            ax.axis("off")
            continue
        lo, hi = _robust_limits(result.matrices[h])
        ax.imshow(result.matrices[h], cmap="viridis", interpolation="nearest", vmin=lo, vmax=hi)
        ax.set_title(f"head {h}: R² = {result.toeplitz_r2[h]:.3f}", fontsize=8)
        ax.set_xticks([]), ax.set_yticks([])
    fig.suptitle(f"{result.model}: F̂_P, layer {result.layer}, {result.mode} mode (row i = query, column j = key)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def profile_grid(result, layer_index: int = 0):
    """Per head: sections of F_hat_P at 5 rows i (thin lines) and the profile (thick), over k = j - i.

    Paper Figs. 3, 6 and 7: when F_hat_P is near-Toeplitz the sections coincide with the profile.
    """
    plt = _plt()
    w = result.window
    ks = np.arange(-w, w + 1)
    centre = result.n_positions - 1
    rows, cols = _grid(result.n_heads)
    fig, axes = plt.subplots(rows, cols, figsize=(2.8 * cols, 2.2 * rows + 0.6), squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= result.n_heads:
            ax.axis("off")
            continue
        for s, row in enumerate(result.section_rows):
            ax.plot(ks, result.sections[layer_index, h, s], lw=0.8, alpha=0.6, label=f"i = {row}")
        ax.plot(ks, result.profiles[layer_index, h, centre - w:centre + w + 1], color="black", lw=1.8, label="profile")
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_title(f"head {h}", fontsize=8)
        ax.tick_params(labelsize=6)
    axes.flat[0].legend(fontsize=5, loc="best")
    layer = result.layers[layer_index]
    fig.suptitle(f"{result.model}: positional profiles, layer {layer}, {result.mode} mode "
                 f"(x: k = j − i, positive = later key)", fontsize=10)
    fig.supxlabel("k = j − i", fontsize=8)
    fig.tight_layout()
    return fig


def compare_heatmaps(rows):
    """Side-by-side P heatmaps of several models (paper Fig. 1)."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(rows), figsize=(3.6 * len(rows), 3.8), squeeze=False)
    for row, ax in zip(rows, axes.flat):
        lo, hi = _robust_limits(row.matrix)
        ax.imshow(row.matrix, cmap="Reds", interpolation="nearest", vmin=lo, vmax=hi)
        ax.set_title(f"{row.model}\nR² = {row.toeplitz_r2:.3f}", fontsize=9)
        ax.set_xticks([]), ax.set_yticks([])
    fig.tight_layout()
    return fig
