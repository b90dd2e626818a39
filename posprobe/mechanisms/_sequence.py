"""Depthwise convolutions along the sequence, shared by `depthwise`, `cat` and `conv-qkv`.

Filters are centred: weight column `k + r` multiplies the token at offset `k = j - i` from the output
position `i` (torch's conv1d is a cross-correlation, which is exactly this orientation). Padded tokens
are zeroed before filtering, so they never reach real tokens; the sequence ends are zero-padded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def zero_padding(x: torch.Tensor, key_valid: torch.Tensor | None) -> torch.Tensor:
    """`x` `(B, n, d)` with padded positions (`key_valid` False) set to zero."""
    if key_valid is None:
        return x
    return x * key_valid[:, :, None].to(x.dtype)


def depthwise_along_sequence(x: torch.Tensor, weight: torch.Tensor, groups: int | None = None) -> torch.Tensor:
    """Centred depthwise filter: `y[b, i, c] = sum_k weight[c, k + r] * x[b, i + k, c]`.

    x: `(B, n, d)`; weight: `(d, 2r+1)`; returns `(B, n, d)`. With `groups=d` and weight `(m*d, 2r+1)`,
    input channel c feeds output channels m*c .. m*c + m - 1 (several filters per channel at once).
    """
    return depthwise_channels_first(x.transpose(1, 2), weight, groups).transpose(1, 2)


def depthwise_channels_first(x: torch.Tensor, weight: torch.Tensor, groups: int | None = None) -> torch.Tensor:
    """Same filter on `x` `(B, d, n)` -> `(B, d_out, n)`.

    Runs as a grouped conv2d over a `(B, d, 1, n)` view: on CPU this takes oneDNN's fast depthwise kernels
    (about 8x faster forward+backward than grouped conv1d at B=32, n=128, d=384).
    """
    d_out, size = weight.shape
    r = size // 2
    y = F.conv2d(
        x[:, :, None, :],
        weight.to(x.dtype)[:, None, None, :],
        padding=(0, r),
        groups=d_out if groups is None else groups,
    )
    return y[:, :, 0, :]


def dirac(d: int, radius: int) -> torch.Tensor:
    """Identity filter bank `(d, 2r+1)`: 1 at offset 0."""
    w = torch.zeros(d, 2 * radius + 1)
    w[:, radius] = 1.0
    return w


def naive_filter(x: torch.Tensor, weight: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Loop reference of `depthwise_along_sequence` for one sequence `x` `(n, d)`, skipping padded tokens."""
    n = x.shape[0]
    r = weight.shape[1] // 2
    rows = []
    for i in range(n):
        acc = torch.zeros(x.shape[1], dtype=x.dtype)
        for k in range(-r, r + 1):
            j = i + k
            if 0 <= j < n and bool(valid[j]):
                acc = acc + weight[:, k + r] * x[j]
        rows.append(acc)
    return torch.stack(rows)
