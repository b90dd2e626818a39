"""The recorders: taps on the attention kernel (`posprobe.kernel`) that keep each layer's scores and probabilities.

`LayerRecorder` records whole (m x m) matrices on the kernel's eager route (`RECORD_NAME`, its masks the stock
`eager_mask`, exactly the eager path's additive masks); `BlockRecorder` hands on blocks of query rows on its
blockwise route (SPEC §19, `BLOCK_NAME`: no (m x m) tensor is made, neither scores nor mask). Each gives the
`Taps` (`taps()`) a forward pass carries down to the kernel; the kernel computes what the model's eager attention
computes and returns the same output. `verify_against_eager` (the kernel's) refuses a family whose outputs the
kernel does not reproduce. No model code is edited.

Dimensions: B batch, H query heads, m sequence length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posprobe.errors import PosprobeError
from posprobe.kernel import BLOCKS as BLOCK_NAME
from posprobe.kernel import EAGER as RECORD_NAME
from posprobe.kernel import Taps
from posprobe.kernel import register as register_recording_attention
from posprobe.kernel.routes import verify_against_eager

if TYPE_CHECKING:
    import torch

register_block_attention = register_recording_attention  # one registration: every route of the kernel
__all__ = ["BLOCK_NAME", "RECORD_NAME", "BlockRecorder", "LayerRecorder", "register_recording_attention",
           "verify_against_eager"]  # fmt: skip


def _check_call(call: int, n_layers: int) -> None:
    """PosprobeError when attention call `call` (0-based) of one forward pass is past the model's `n_layers`: the
    one place both recorders (whole and blockwise) say what runs more calls than layers."""
    if call >= n_layers:
        raise PosprobeError(
            f"the model ran more attention calls ({call + 1}) than it has layers ({n_layers})",
            "models with several attention stacks (encoder-decoder, vision towers), several different softmax "
            "calls per layer or layers run more than once (loops) are not supported",
        )


class LayerRecorder:
    """Collects one forward pass's attention calls: per layer S and A (B, H, m, m) when asked for, and the pairs
    the model's mask lets query i see key j, `allowed` (B, m, m) bool (shared between layers with the same mask;
    (B, H, m, m) in a layer whose heads pick keys of their own, `group_selected`).
    `heads`: the model's H, where a layer may have fewer query heads (SPEC §9, Laguna): its S and A get NaN heads
    H_l..H-1 (`absent_heads_as_nan`)."""

    def __init__(self, keep_scores: bool, keep_probs: bool, n_layers: int, heads: int | None = None):
        self.keep_scores, self.keep_probs, self.n_layers, self.heads = keep_scores, keep_probs, n_layers, heads
        self.m = 0
        self.scores: list = []
        self.probs: list = []
        self.allowed: list = []
        self._cache: tuple[Any, Any] | None = None

    def begin(self, batch: int, m: int) -> None:
        self.batch, self.m = batch, m
        self.scores, self.probs, self.allowed, self._cache = [], [], [], None

    @property
    def calls(self) -> int:
        return len(self.allowed)

    def taps(self) -> Taps:
        """Taps that record every attention call of a forward pass on the kernel's eager route."""
        return Taps().on("pattern", self._tap)

    def _tap(self, probs, call) -> None:
        own = call.own  # the sequence's keys: pooled entries after them are no tokens
        picked = None if call.selected is None else call.selected[..., :own]
        if not call.repeated:  # a call that repeats the last one (DiffLlama) is the same softmax: recorded once
            self.record(call.scores[..., :own], probs[..., :own], call.mask, picked)

    def _allowed(self, mask, device) -> torch.Tensor:
        import torch

        key = None if mask is None else (mask.data_ptr(), tuple(mask.shape))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        m = self.m
        if mask is None:
            allowed = torch.ones((1, m, m), dtype=torch.bool, device=device).expand(self.batch, m, m)
        else:
            allowed = mask[:, 0, :, :m] if mask.dim() == 4 else mask[..., :m]
            if allowed.dtype != torch.bool:
                allowed = allowed > torch.finfo(allowed.dtype).min / 2
            allowed = allowed.expand(self.batch, m, m)
        self._cache = (key, allowed)
        return allowed

    def record(self, scores, probs, mask, selected=None) -> None:
        """Keep one attention call's S and A (B, H_l, m, m), its mask and an indexer's `selected` keys."""
        layer = self.calls
        if scores.shape[-2] != self.m or scores.shape[-1] != self.m:
            raise PosprobeError(
                f"an attention call saw {scores.shape[-2]} queries and {scores.shape[-1]} keys for sequences of "
                f"{self.m}",
                "only self-attention over the input (encoders and decoders, no cache, no cross-attention) is supported",
            )
        _check_call(layer, self.n_layers)
        allowed = self._allowed(mask, scores.device)
        if selected is not None:  # an indexed layer's top-k keys, (B, m, m), or each head's picked blocks
            allowed = (allowed if selected.dim() == 3 else allowed[:, None]) & selected
        self.allowed.append(allowed)
        if self.keep_scores:
            self.scores.append(absent_heads_as_nan(scores.detach(), self.heads))
        if self.keep_probs:
            self.probs.append(absent_heads_as_nan(probs.detach(), self.heads))


def absent_heads_as_nan(values: torch.Tensor, heads: int | None) -> torch.Tensor:
    """A layer's S or A (B, H_l, ...) on the model's head axis of `heads` H >= H_l (SPEC §9: a layer with fewer
    query heads than the model's most, Laguna): heads H_l..H-1 are NaN, no such head, as in the content-free
    scores; `values` itself where H_l = H or `heads` is None."""
    import torch

    if heads is None or values.shape[1] == heads:
        return values
    missing = values.new_full((values.shape[0], heads - values.shape[1], *values.shape[2:]), float("nan"))
    return torch.cat([values, missing], dim=1)


# The blockwise route: the same attention, computed and recorded a block of query rows at a time, so that no layer's
# (queries x keys) matrix, and no (m x m) mask, is ever made (SPEC §19).


class BlockRecorder:
    """Its taps (`taps()`) receive every block the kernel's blockwise route computes: `hand(layer, start, S, A,
    allowed)` with S and A (B, H, b, m) of query rows start..start+b-1 and allowed (B, b, m) bool ((B, H, b, m)
    where each head picks keys of its own, `group_selected`); counts the layers (`calls`).
    `rows`: query rows per block, or None for about `BLOCK_ELEMENTS` scores per block. `hand` None: nothing is
    recorded (the first batch's check runs this way). `heads`: as `LayerRecorder`'s (S and A of a layer with fewer
    query heads get NaN heads up to H)."""

    def __init__(self, n_layers: int, hand=None, rows: int | None = None, heads: int | None = None):
        self.n_layers, self.hand, self.fixed_rows, self.heads = n_layers, hand, rows, heads
        self.m, self.calls = 0, 0

    def begin(self, m: int) -> None:
        self.m, self.calls = m, 0

    def taps(self) -> Taps:
        """Taps that hand on every block of every attention call of a forward pass on the kernel's blockwise route
        (blocks of `rows` query rows, or of about `BLOCK_ELEMENTS` scores)."""
        return Taps(block_rows=self.fixed_rows).on("pattern", self._tap)

    def _tap(self, probs, call) -> None:
        if call.repeated:  # the last call again (DiffLlama): computed, not recorded
            return
        start = call.rows[0]
        if start == 0:
            self.check(call.queries, probs.shape[-1])
            self.calls += 1
        if self.hand is not None:
            scores, probs = (absent_heads_as_nan(x, self.heads) for x in (call.scores, probs))
            self.hand(self.calls - 1, start, scores, probs, call.allowed)

    def check(self, queries: int, keys: int) -> None:
        if queries != self.m or keys != self.m:
            raise PosprobeError(
                f"an attention call saw {queries} queries and {keys} keys for sequences of {self.m}",
                "only self-attention over the input (encoders and decoders, no cache, no cross-attention) is supported",
            )
        _check_call(self.calls, self.n_layers)
