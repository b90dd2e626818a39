"""FlexAttention for score-bias mechanisms: attention whose `score_mod` reads the per-head tables by
`k = j - i`, instead of materialising a `(B, H, n_q, n_k)` bias for SDPA.

A mechanism's `score_mod(query, key)` returns `mod(score, b, h, q_idx, kv_idx) -> score + bias[b, h, q_idx,
kv_idx]` (the same numbers as its `score_bias`; the tests compare them on index grids and through
`flex_attention` on CPU). `posprobe.retrofitting.attention.posprobe_attention` uses it on the devices in `FLEX_DEVICES`
(CUDA) when `torch.nn.attention.flex_attention` exists and no attention dropout is active (FlexAttention has
none); any other case, or a first failure to compile, takes today's path.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch

ScoreMod = Callable[..., torch.Tensor]  # (score, b, h, q_idx, kv_idx) -> score

FLEX_DEVICES: set[str] = {"cuda"}  # tests add "cpu" (forward only: no FlexAttention backward on CPU)
_disabled: list[str] = []  # the reason FlexAttention was switched off in this process, once it failed


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return not _disabled


def has_score_bias(mechanism) -> bool:
    """Whether `mechanism` overrides `score_bias` (its bias may still be None for a combined mechanism)."""
    from posprobe.mechanisms.base import PositionalMechanism

    return type(mechanism).score_bias is not PositionalMechanism.score_bias


def clip_bound(radius: int, device: torch.device) -> torch.Tensor:
    """The clip radius as a 0-dim integer tensor, for `score_mod`s that clamp `kv_idx - q_idx` to `[-r, r]`.

    A plain Python `int` captured by a `score_mod` becomes a symbolic size under `torch.compile(dynamic=True)`,
    and torch 2.11's inductor could not lower the backward of a clamp with symbolic bounds on CUDA
    ("'ShapeAsConstantBuffer' object has no attribute 'dtype'"; seen on an H100, benchmarks/RESULTS.md §8): every
    relative-table mechanism then fell back to the SDPA path. A tensor bound is an ordinary captured buffer."""
    return torch.tensor(radius, device=device)


def sum_mods(mods: list[ScoreMod | None]) -> ScoreMod | None:
    """One score_mod adding every part's bias; None if a part has no score_mod (no flex path then)."""
    if not mods or any(m is None for m in mods):
        return None
    if len(mods) == 1:
        return mods[0]

    def mod(score, b, h, q_idx, kv_idx):
        for m in mods:
            score = m(score, b, h, q_idx, kv_idx)
        return score

    return mod


@functools.lru_cache(maxsize=1)
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    if torch.cuda.is_available():
        return torch.compile(flex_attention, dynamic=True)  # eager flex is a slow reference implementation
    return flex_attention


def flex_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mod: ScoreMod,
    key_valid: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor | None:
    """`softmax(Q K^T * scaling + bias) V` with the bias from `mod` and padded keys (`key_valid` `(B, n_k)`,
    False = padding) masked; `(B, H, n_q, d_h)`. None (and FlexAttention off for this process, with one
    warning) if it fails for a reason other than memory."""
    if key_valid is not None:
        pad = torch.zeros(key_valid.shape, dtype=query.dtype, device=query.device)
        pad = pad.masked_fill(~key_valid, float("-inf"))  # (B, n_k)
        biased = mod

        def mod_and_padding(score, b, h, q_idx, kv_idx):
            return biased(score, b, h, q_idx, kv_idx) + pad[b, kv_idx]

        mod = mod_and_padding
    try:
        return _compiled()(query, key, value, score_mod=mod, scale=scaling)
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, NotImplementedError, TypeError, AssertionError) as err:
        _disabled.append(f"{type(err).__name__}: {err}")
        warnings.warn(
            f"posprobe: FlexAttention failed ({_disabled[0][:200]}); using the SDPA path from now on", stacklevel=2
        )
        return None


def use_flex(query: torch.Tensor, mechanism, dropout: float, output_attentions: bool) -> bool:
    """Whether the flex path applies to this call (see the module docstring)."""
    return (
        query.device.type in FLEX_DEVICES
        and dropout == 0.0
        and not output_attentions
        and mechanism is not None
        and not mechanism.needs_probabilities
        and has_score_bias(mechanism)
        and flex_available()
    )
