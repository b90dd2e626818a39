"""TISA: translation-invariant self-attention (SPEC §4).

Per head `h`: `f_h(k) = sum_s a[h,s] * exp(-|b[h,s]| * (k - c[h,s])^2)` with `k = j - i`, added to the
pre-softmax scores as the Toeplitz matrix `F_P[h, i, j] = f_h(j - i)`. A kernel with `c > 0` peaks to the
right: query `i` favours key `j = i + c`. Parameters `a, b, c` of shape `(H, S)`: `3*S*H` per depth.
Supplement mode keeps the position embeddings; replace mode is `drop_position_embeddings=True` in retrofit.
The bias is a Toeplitz view of the `(H, n_q + n_k - 1)` vector of `f` values (no per-pair maths).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from posprobe.errors import PosprobeError
from posprobe.mechanisms.base import LayerShape, PositionalMechanism, offset_range, register, toeplitz
from posprobe.mechanisms.catalogue import Options


def tisa_profile(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """`f(k)` for kernels `(H, S)` at offsets `k` (any shape K) -> `(H, *K)`."""
    kk = k.to(a.dtype)[..., None]  # (*K, 1)
    shape = (a.shape[0],) + (1,) * k.dim() + (a.shape[1],)
    a_, b_, c_ = (t.view(shape) for t in (a, b, c))
    return (a_ * torch.exp(-b_.abs() * (kk - c_) ** 2)).sum(-1)


@register
class TISA(PositionalMechanism):
    name = "tisa"

    def __init__(self, shape: LayerShape, options: Options | None = None):
        super().__init__(shape, options)
        H, S = shape.num_heads, self.kernels
        self.a = nn.Parameter(torch.zeros(H, S))
        self.b = nn.Parameter(torch.zeros(H, S))
        self.c = nn.Parameter(torch.zeros(H, S))

    def reset(self, init: str = "zero", generator: torch.Generator | None = None) -> None:
        H, S = self.a.shape
        with torch.no_grad():
            # widths/centres spread over [-r/2, r/2] so that a zero amplitude still has useful gradients
            half = self.radius / 2
            centres = torch.linspace(-half, half, S) if S > 1 else torch.zeros(1)
            self.c.copy_(centres.expand(H, S))
            self.b.fill_(0.5)
            self.a.zero_()
            if init == "random":
                self.a.copy_(0.5 * torch.randn(H, S, generator=generator))
                self.b.copy_(0.05 + torch.rand(H, S, generator=generator))
                self.c.copy_((2 * torch.rand(H, S, generator=generator) - 1) * self.radius)

    def load_kernels(self, a, b, c) -> None:
        arrays = [np.asarray(t, dtype=np.float64) for t in (a, b, c)]
        if any(t.shape != tuple(self.a.shape) for t in arrays):
            raise PosprobeError(
                f"kernels file has per-layer shape {arrays[0].shape}, the model needs {tuple(self.a.shape)} "
                "(heads, kernels)",
                "fit the kernels on the same model",
            )
        with torch.no_grad():
            for param, arr in zip((self.a, self.b, self.c), arrays):
                param.copy_(torch.from_numpy(arr).to(param.dtype))

    def profile(self, k: torch.Tensor) -> torch.Tensor:
        """`f_h(k)` for each head: `(H, *k.shape)`."""
        return tisa_profile(self.a, self.b, self.c, k)

    def score_bias(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        n_q, n_k = query.shape[-2], key.shape[-2]
        f = self.profile(offset_range(n_q, n_k, self.a.device))  # (H, n_q + n_k - 1), k increasing
        return toeplitz(f, n_q, n_k).unsqueeze(0).to(query.dtype)  # (1, H, n_q, n_k): f(j - i)

    def score_mod(self, query: torch.Tensor, key: torch.Tensor):
        n_q, n_k = query.shape[-2], key.shape[-2]
        f = self.profile(offset_range(n_q, n_k, self.a.device)).to(query.dtype)  # (H, n_q + n_k - 1): f(k)
        shift = n_q - 1  # column of k = 0

        def tisa_mod(score, b, h, q_idx, kv_idx):
            return score + f[h, kv_idx - q_idx + shift]

        return tisa_mod

    def naive_score(self, h, i, j, q_i, k_j):
        k = j - i
        return sum(self.a[h, s] * torch.exp(-self.b[h, s].abs() * (k - self.c[h, s]) ** 2) for s in range(self.kernels))
