"""The one interface every positional mechanism implements, and the registry of their torch classes.

The registry is keyed by the names of the torch-free `catalogue` (which also holds each mechanism's
options class and parameter count); a class is constructed as `cls(shape, options)`.

Conventions (SPEC §4–6): tensors inside attention are `(B, H, n, d_h)`; query row `i` attends key
column `j`; the relative offset is `k = j - i` (positive = key to the right); with clip radius `r`,
`kc = clip(j - i, -r, r)` and tables indexed by offset store row `kc + r` (so row 0 is `k = -r`).

A mechanism lives in one attention layer at one depth. It may contribute through any of these hooks,
all optional (the defaults contribute nothing):

* `score_bias(query, key)`: an additive pre-softmax bias `(B or 1, H, n_q, n_k)`;
* `value_term(probs, value)`: a term added to the attention output that needs the (post-dropout)
  attention probabilities `(B, H, n_q, n_k)` -> `(B, H, n_q, d_h)`;
* `output_term(value, key_valid)`: a term added to the attention output after softmax that does not
  need the probabilities -> `(B, H, n_q, d_h)`;
* `transform_inputs(role, x, key_valid)`: rewrite the input `(B, n, d)` of the query/key/value
  projection (`role` in "query", "key", "value") before the projection runs;
* `transform_projection(role, x, out, key_valid)`: rewrite the projection output `(B, n, H*d_h)`.

`key_valid` is a `(B, n)` bool tensor (True = real token) or None when nothing is padded.
Each mechanism also carries a naive per-pair reference (`naive_*` hooks, Python loops) that the shared
test suite compares the efficient hooks against.
"""

from __future__ import annotations

from functools import lru_cache
from typing import ClassVar

import torch
from torch import nn

from posprobe.errors import PosprobeError
from posprobe.mechanisms.catalogue import CATALOGUE, LayerShape, MechanismInfo, Options, mechanism_info

ROLES = ("query", "key", "value")


class PositionalMechanism(nn.Module):
    """Base class: subclasses set `name` (a `catalogue` entry, which holds the summary, options class and
    parameter count), create parameters in `__init__` and override some hooks."""

    name: ClassVar[str] = ""
    info: ClassVar[MechanismInfo]  # set by `register`
    summary: ClassVar[str] = ""  # set by `register`, from the catalogue
    supports_fit: ClassVar[bool] = False  # from the catalogue: initialised from a kernels file
    needs_probabilities: ClassVar[bool] = False  # value_term used -> explicit (eager) attention path
    has_output_term: ClassVar[bool] = False
    transforms_inputs: ClassVar[bool] = False
    transforms_projections: ClassVar[bool] = False

    def __init__(self, shape: LayerShape, options: Options | None = None):
        """`options`: an instance of this mechanism's options class (None = its defaults)."""
        super().__init__()
        if options is None:
            options = self.info.options_class()
        if not isinstance(options, self.info.options_class):
            raise TypeError(f"{self.name} takes {self.info.options_class.__name__}, got {type(options).__name__}")
        self.shape = shape
        self.options = options
        self.radius = int(getattr(options, "radius", 0))
        self.kernels = int(getattr(options, "kernels", 0))

    # -- efficient hooks ---------------------------------------------------------------------------
    def score_bias(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
        """Additive pre-softmax bias `(B or 1, H, n_q, n_k)` for query `(B, H, n_q, d_h)`, key `(B, H, n_k, d_h)`."""
        return None

    def score_mod(self, query: torch.Tensor, key: torch.Tensor):
        """FlexAttention form of `score_bias`: `mod(score, b, h, q_idx, kv_idx) -> score + bias[b, h, q_idx,
        kv_idx]`, reading per-head tables by `kv_idx - q_idx`; None = no flex path (`posprobe.mechanisms.flex`)."""
        return None

    def value_term(self, probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor | None:
        """Extra output `(B, H, n_q, d_h)` from the probabilities `(B, H, n_q, n_k)`."""
        return None

    def output_term(self, value: torch.Tensor, key_valid: torch.Tensor | None) -> torch.Tensor | None:
        """Extra output `(B, H, n, d_h)` added after softmax, from the values `(B, H, n, d_h)`."""
        return None

    def transform_inputs(self, role: str, x: torch.Tensor, key_valid: torch.Tensor | None) -> torch.Tensor:
        """New input `(B, n, d)` for the `role` projection."""
        return x

    def transform_projection(
        self, role: str, x: torch.Tensor, out: torch.Tensor, key_valid: torch.Tensor | None
    ) -> torch.Tensor:
        """New output `(B, n, H*d_h)` of the `role` projection given its input `x` `(B, n, d)`."""
        return out

    def attach(self, attention: nn.Module) -> None:
        """Called once after `reset`, with the attention module the mechanism lives in."""

    # -- parameters --------------------------------------------------------------------------------
    def added_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def reset(self, init: str = "zero", generator: torch.Generator | None = None) -> None:
        """`zero`: the mechanism changes nothing (zero biases, identity filters); `random`: small random values."""
        raise NotImplementedError

    def load_kernels(self, a, b, c) -> None:
        raise PosprobeError(
            f"mechanism '{self.name}' cannot be initialised from a TISA kernels file",
            "use --init zero or --init random, or --mechanism tisa",
        )

    # -- naive references (loops; for tests) ---------------------------------------------------------
    def naive_score(self, h: int, i: int, j: int, q_i: torch.Tensor, k_j: torch.Tensor) -> torch.Tensor | float:
        """Bias for head `h`, query `i`, key `j` (vectors `q_i`, `k_j` of size d_h)."""
        return 0.0

    def naive_value(self, h: int, i: int, j: int) -> torch.Tensor | float:
        """Vector (d_h) that pair (i, j) adds to `v_j` inside the probability-weighted sum."""
        return 0.0

    def naive_output(self, h: int, i: int, j: int, v_j: torch.Tensor) -> torch.Tensor | float:
        """Vector (d_h) added to output row `i` for each real key `j`, outside the softmax."""
        return 0.0

    def naive_inputs(self, role: str, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Per-position loop version of `transform_inputs` for one sequence `x` (n, d)."""
        return x

    def naive_projection(self, role: str, x: torch.Tensor, linear: nn.Linear, valid: torch.Tensor) -> torch.Tensor:
        """Per-position loop version of the projection (n, d) -> (n, H*d_h); bypasses the module's hooks."""
        return torch.nn.functional.linear(x, linear.weight, linear.bias)

    def naive_self_attention(
        self, x: torch.Tensor, projections: dict[str, nn.Linear], key_valid: torch.Tensor
    ) -> torch.Tensor:
        """Reference self-attention output `(B, n, H*d_h)` written as loops over (b, h, i, j)."""
        B, n, _ = x.shape
        H, dh = self.shape.num_heads, self.shape.head_dim
        out = torch.zeros(B, n, H * dh, dtype=x.dtype)
        for b in range(B):
            valid = key_valid[b]
            proj = {}
            for role in ROLES:
                xr = self.naive_inputs(role, x[b], valid)
                proj[role] = self.naive_projection(role, xr, projections[role], valid).view(n, H, dh)
            q, k, v = proj["query"], proj["key"], proj["value"]
            for h in range(H):
                for i in range(n):
                    scores = []
                    for j in range(n):
                        s = q[i, h] @ k[j, h] / dh**0.5 + self.naive_score(h, i, j, q[i, h], k[j, h])
                        scores.append(s if bool(valid[j]) else s - 1e30)
                    alpha = torch.softmax(torch.stack([torch.as_tensor(s, dtype=x.dtype) for s in scores]), 0)
                    z = torch.zeros(dh, dtype=x.dtype)
                    for j in range(n):
                        if bool(valid[j]):
                            z = (
                                z
                                + alpha[j] * (v[j, h] + self.naive_value(h, i, j))
                                + self.naive_output(h, i, j, v[j, h])
                            )
                    out[b, i, h * dh : (h + 1) * dh] = z
        return out

    def extra_repr(self) -> str:
        return f"H={self.shape.num_heads}, d_h={self.shape.head_dim}, {self.options}"


def reset_parameter(
    param: nn.Parameter, init: str, generator: torch.Generator | None, scale: float, start: torch.Tensor | None = None
) -> None:
    """Set `param` to its no-change value `start` (zeros when None; broadcast to the parameter) and, for
    init "random", add N(0, scale^2) noise drawn from `generator`."""
    with torch.no_grad():
        if start is None:
            param.zero_()
        else:
            param.copy_(start.expand_as(param))
        if init == "random":
            param.add_(scale * torch.randn(param.shape, generator=generator))


REGISTRY: dict[str, type[PositionalMechanism]] = {}  # filled as the mechanism modules are imported


def register(cls: type[PositionalMechanism]) -> type[PositionalMechanism]:
    """Class decorator: add a mechanism to `REGISTRY` under its `name`, which must be a `catalogue` entry
    pointing at this class (the catalogue is the torch-free list of names, options and counts)."""
    info = CATALOGUE.get(cls.name)
    if info is None or cls.name in REGISTRY or (info.module, info.class_name) != (cls.__module__, cls.__name__):
        raise ValueError(f"mechanism {cls.name!r} is not in posprobe.mechanisms.catalogue or already registered")
    cls.info = info
    cls.supports_fit = info.supports_fit
    cls.summary = info.summary
    REGISTRY[cls.name] = cls
    return cls


def get_mechanism(name: str) -> type[PositionalMechanism]:
    """The torch class of mechanism `name` (imported on first use)."""
    return mechanism_info(name).load()


# -- shared index helpers (cached by size; tiny long tensors, never B x H x n x n). Each is made outside inference
# mode even when first asked for inside it (a run on the run loop, `capture.loop`): the same cached tensor later
# serves training, and autograd refuses to save an inference tensor.
@lru_cache(maxsize=8)
def _offset_index(n_q: int, n_k: int, device_str: str) -> torch.Tensor:
    device = torch.device(device_str)
    with torch.inference_mode(False):
        return torch.arange(n_k, device=device)[None, :] - torch.arange(n_q, device=device)[:, None]


def offsets(n_q: int, n_k: int, device: torch.device) -> torch.Tensor:
    """`(n_q, n_k)` long tensor of `k = j - i`."""
    return _offset_index(n_q, n_k, str(device))


@lru_cache(maxsize=8)
def _clipped(n_q: int, n_k: int, radius: int, device_str: str) -> torch.Tensor:
    with torch.inference_mode(False):
        return _offset_index(n_q, n_k, device_str).clamp(-radius, radius) + radius


def clipped_index(n_q: int, n_k: int, radius: int, device: torch.device) -> torch.Tensor:
    """`(n_q, n_k)` long tensor of `kc + r = clip(j - i, -r, r) + r`, a row index into a (2r+1)-row table."""
    return _clipped(n_q, n_k, radius, str(device))


def relative_to_absolute(rel: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Spread per-offset scores `rel` `(B, H, n_q, 2r+1)` to `(B, H, n_q, n_k)` by `index` `(n_q, n_k)`.

    Shaw et al. §3.3: the `(B, H, n_q, 2r+1)` product is computed once; the index is only expanded (a view).
    """
    return rel.gather(-1, index.expand(*rel.shape[:-2], *index.shape))


def offset_range(n_q: int, n_k: int, device: torch.device) -> torch.Tensor:
    """The `n_q + n_k - 1` offsets `k = -(n_q-1) .. n_k-1`, increasing (the layout of a profile vector)."""
    return _offset_range(n_q, n_k, str(device))


@lru_cache(maxsize=8)
def _offset_range(n_q: int, n_k: int, device_str: str) -> torch.Tensor:
    with torch.inference_mode(False):
        return torch.arange(-(n_q - 1), n_k, device=torch.device(device_str))


def toeplitz(profile: torch.Tensor, n_q: int, n_k: int) -> torch.Tensor:
    """`T[..., i, j] = profile[..., j - i + n_q - 1]` from a profile `(..., n_q + n_k - 1)` over increasing `k`.

    Built as sliding windows (a view) plus one flip: `(..., n_q, n_k)`, no index tensor, cheap backward.
    """
    return profile.unfold(-1, n_k, 1).flip(-2)


def clip(k: int, radius: int) -> int:
    return max(-radius, min(radius, k))
