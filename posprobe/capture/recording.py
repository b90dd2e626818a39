"""The recording attention function: eager attention that also keeps each layer's scores and probabilities.

Registered in transformers' `AttentionInterface` under `RECORD_NAME` (its masks come from the stock `eager_mask`,
so they are exactly the eager path's additive masks), it computes what the model's eager attention computes
(scaling, the mask/bias argument — padding, causality, sliding windows, relative biases or ALiBi where a family
passes them there —, grouped-query heads, softcapping) and returns the same output; while a `LayerRecorder` is
active it hands that recorder S and A of every call, in depth order. `verify_against_eager` runs a batch with the
model's own eager attention and refuses a family whose outputs this function does not reproduce. No model code
is edited.

Dimensions: B batch, H query heads, H_kv key/value heads, m sequence length, d_h head size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posprobe.errors import PosprobeError

if TYPE_CHECKING:
    import torch

RECORD_NAME = "posprobe-record"
_ACTIVE: list[LayerRecorder] = []  # the recorder of the forward pass running now (at most one)


class LayerRecorder:
    """Collects one forward pass's attention calls: per layer S and A (B, H, m, m) when asked for, and the pairs
    the model's mask lets query i see key j, `allowed` (B, m, m) bool (shared between layers with the same mask)."""

    def __init__(self, keep_scores: bool, keep_probs: bool, n_layers: int):
        self.keep_scores, self.keep_probs, self.n_layers = keep_scores, keep_probs, n_layers
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

    def __enter__(self) -> LayerRecorder:
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)

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

    def record(self, scores, probs, mask) -> None:
        layer = self.calls
        if scores.shape[-2] != self.m or scores.shape[-1] != self.m:
            raise PosprobeError(
                f"an attention call saw {scores.shape[-2]} queries and {scores.shape[-1]} keys for sequences of "
                f"{self.m}",
                "only self-attention over the input (encoders and decoders, no cache, no cross-attention) is supported",
            )
        if layer >= self.n_layers:
            raise PosprobeError(
                f"the model ran more attention calls ({layer + 1}) than it has layers ({self.n_layers})",
                "models with several attention stacks (encoder-decoder, vision towers) are not supported",
            )
        self.allowed.append(self._allowed(mask, scores.device))
        if self.keep_scores:
            self.scores.append(scores.detach())
        if self.keep_probs:
            self.probs.append(probs.detach())


def recording_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
):
    """Eager attention that also records scores and probabilities; transformers' attention-function contract.

    query (B, H, m, d_h), key/value (B, H_kv, m, d_h) (grouped-query heads repeated as `repeat_kv` does),
    attention_mask additive (B, 1, m, m) or None. S = QK^T * scaling (softcapped when the family asks),
    plus the mask/bias; A = softmax(S) in float32, cast back. With learned sinks (`s_aux` (H,), gpt-oss) the
    softmax also runs over one sink logit per head and A keeps the real keys' columns: each row sums to one minus
    the sink's share. Returns ((B, m, H, d_h), A).
    """
    import torch

    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask[..., : key.shape[-2]]
    sinks = kwargs.get("s_aux")  # learned per-head sink logits (gpt-oss): one more softmax column, no value
    if sinks is not None:
        column = sinks.reshape(1, -1, 1, 1).to(scores.dtype).expand(scores.shape[0], -1, scores.shape[-2], 1)
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1, dtype=torch.float32)[..., :-1]
        probs = probs.to(query.dtype)  # rows sum to 1 - the sink's share: A holds the real keys only
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    dropped = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(dropped, value).transpose(1, 2).contiguous()
    if _ACTIVE:
        _ACTIVE[-1].record(scores, probs, attention_mask)
    return out, probs


def register_recording_attention() -> None:
    """Register `recording_attention` (and the eager mask for it) under `RECORD_NAME`; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(RECORD_NAME, recording_attention)
    AttentionMaskInterface.register(RECORD_NAME, eager_mask)


def final_output(output) -> torch.Tensor:
    """The model's last output tensor: `last_hidden_state` of a base model, else `logits`."""
    value = getattr(output, "last_hidden_state", None)
    return value if value is not None else output.logits


def relative_gap(output, reference, attention_mask) -> tuple[float, float]:
    """(largest |difference| of the two runs' final outputs on real tokens, relative to the reference's largest
    value; the tolerance for their dtype)."""
    import torch

    ours, ref = final_output(output), final_output(reference)
    real = attention_mask.bool()
    scale = ref[real].abs().max().clamp(min=1e-6)
    tol = 1e-4 if ref.dtype == torch.float32 or ref.dtype == torch.float64 else 3e-2
    gap = float((ours[real] - ref[real]).abs().max() / scale)
    return (gap if gap == gap else float("inf")), tol  # NaN counts as a failure


def verify_against_eager(model, input_ids, attention_mask, output) -> None:
    """Refuse a model whose recorded attention does not reproduce its own eager attention on this batch: the same
    batch is run again with the model's "eager" attention and the final outputs must agree on real tokens."""
    model.set_attn_implementation("eager")
    try:
        reference = model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        model.set_attn_implementation(RECORD_NAME)
    gap, tol = relative_gap(output, reference, attention_mask)
    if gap > tol:
        raise PosprobeError(
            f"recording the attention of '{getattr(model.config, 'model_type', 'unknown')}' changes its outputs "
            f"(relative difference {gap:.2e} from its eager attention)",
            "this family computes attention in a way posprobe attention does not reproduce; please report it",
        )
