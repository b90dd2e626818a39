"""The recording attention function: eager attention that also keeps each layer's scores and probabilities.

Registered in transformers' `AttentionInterface` under `RECORD_NAME` (its masks come from the stock `eager_mask`,
so they are exactly the eager path's additive masks), it computes what the model's eager attention computes
(scaling, the mask/bias argument — padding, causality, sliding windows, relative biases or ALiBi where a family
passes them there —, grouped-query heads, softcapping) and returns the same output; while a `LayerRecorder` is
active it hands that recorder S and A of every call, in depth order. `verify_against_eager` runs a batch with the
model's own eager attention and refuses a family whose outputs this function does not reproduce. No model code
is edited.

The blockwise route (SPEC §19) registers `block_attention` under `BLOCK_NAME`: the same computation one block of
query rows at a time, its masks `RowMask`s (transformers' mask function evaluated for the block's rows only), each
block handed to the active `BlockRecorder`; no (m x m) tensor is made, neither scores nor mask.

Dimensions: B batch, H query heads, H_kv key/value heads, m sequence length, d_h head size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posprobe.errors import PosprobeError

if TYPE_CHECKING:
    import torch

RECORD_NAME = "posprobe-record"
_ACTIVE: list[LayerRecorder] = []  # the recorder of the forward pass running now (at most one)


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
        self._last: tuple | None = None  # the last call recorded (`repeats`)
        self.scores: list = []
        self.probs: list = []
        self.allowed: list = []
        self._cache: tuple[Any, Any] | None = None

    def begin(self, batch: int, m: int) -> None:
        self.batch, self.m = batch, m
        self.scores, self.probs, self.allowed, self._cache = [], [], [], None
        self._last = None

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

    def record(self, scores, probs, mask, selected=None, call: tuple | None = None) -> None:
        """Keep one attention call's S and A (B, H_l, m, m), its mask and an indexer's `selected` keys; `call`
        (module, query, key, mask) of the call: a call that repeats the last one (`repeats`) is not recorded."""
        if repeats(call, self._last):
            return
        self._last = call
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


def repeats(call: tuple | None, last: tuple | None) -> bool:
    """True when attention call `call` (module, query, key, mask) is the same module on the same query, key and
    mask tensors as the `last` call: the same softmax, A applied to other values (DiffLlama's differential
    attention runs its H softmax heads once for each half of its values), so one layer's S and A, recorded once."""
    return call is not None and last is not None and all(a is b for a, b in zip(call, last, strict=True))


def absent_heads_as_nan(values: torch.Tensor, heads: int | None) -> torch.Tensor:
    """A layer's S or A (B, H_l, ...) on the model's head axis of `heads` H >= H_l (SPEC §9: a layer with fewer
    query heads than the model's most, Laguna): heads H_l..H-1 are NaN, no such head, as in the content-free
    scores; `values` itself where H_l = H or `heads` is None."""
    import torch

    if heads is None or values.shape[1] == heads:
        return values
    missing = values.new_full((values.shape[0], heads - values.shape[1], *values.shape[2:]), float("nan"))
    return torch.cat([values, missing], dim=1)


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
    the sink's share (and, where pooled entries follow the keys, `own_keys`, minus theirs: S and A are recorded
    over the sequence's keys). With top-k key indices (`indices` (B, m, k), DeepSeek Sparse Attention's indexer,
    passed to attention functions other than eager / sdpa instead of being folded into the mask) every other key is
    masked as the eager path masks it (the dtype's minimum); with key blocks picked per key-head group
    (`block_indices`, MiniMax M3's block indexer) each query head's other keys are masked so, and the layer's
    allowed pairs are per head (`group_selected`). Returns ((B, m, H, d_h), A).
    """
    import torch

    call = (module, query, key, attention_mask)  # a repeated call (the same tensors) is recorded once (`repeats`)
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
    selected = _selected(kwargs.get("indices"), scores.shape[-1])
    if selected is not None:
        scores = scores.masked_fill(~selected[:, None], torch.finfo(scores.dtype).min)
    group = group_selected(module, kwargs.get("block_indices"), query.shape[1], scores.shape[-1])
    if group is not None:  # (B, H, m, keys): each query head's own keys
        scores = scores.masked_fill(~group, torch.finfo(scores.dtype).min)
        selected = group if selected is None else selected[:, None] & group
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
        own = own_keys(module, query, key)  # the sequence's keys: pooled entries after them are no tokens
        picked = None if selected is None else selected[..., :own]
        _ACTIVE[-1].record(scores[..., :own], probs[..., :own], attention_mask, picked, call)
    return out, probs


def own_keys(module, query, key) -> int:
    """How many keys of a call are the sequence's own tokens: all, or, where the family appends entries pooled over
    blocks of tokens after them (`Family.tensors['pooled_keys']`: DeepSeek V4's compressed layers), the first m, as
    many as the queries (a capture runs no cache). Their A is the model's: the pooled entries' share is left out."""
    keys, m = key.shape[-2], query.shape[-2]
    if keys <= m:
        return keys
    from posprobe.families import family_for_type

    family = family_for_type(str(getattr(getattr(module, "config", None), "model_type", "")))
    return m if family is not None and "pooled_keys" in family.tensors else keys


def group_selected(module, block_indices, heads: int, keys: int):
    """(B, H, m, keys) bool: the keys of the key blocks each query head's key-head group picked, or None where no
    `block_indices` (B, H_I, m, k) are given (MiniMax M3's block indexer: block indices, -1 for an empty slot,
    blocks of the module's `indexer.block_size` keys, the last one short; query head a reads indexer head
    a // (H / H_I)). PosprobeError where the module names no block size."""
    if block_indices is None:
        return None
    import torch

    size = getattr(getattr(module, "indexer", None), "block_size", None)
    if not isinstance(size, int) or size < 1 or heads % block_indices.shape[1]:
        raise PosprobeError(
            f"'{getattr(module.config, 'model_type', 'unknown')}' picks key blocks per key-head group, but its "
            "attention module names no block size (indexer.block_size) or its heads do not split into the groups",
            "read its content-free scores (posprobe fhat / profiles); please report it",
        )
    blocks = -(-keys // size)
    slots = block_indices.long().masked_fill(block_indices < 0, blocks)  # an empty slot: a column dropped below
    picked = torch.zeros((*block_indices.shape[:-1], blocks + 1), dtype=torch.bool, device=block_indices.device)
    picked = picked.scatter(-1, slots, True)[..., :blocks]  # (B, H_I, m, blocks)
    selected = picked.repeat_interleave(size, dim=-1)[..., :keys]
    return selected.repeat_interleave(heads // block_indices.shape[1], dim=1)


def _selected(indices, keys: int):
    """(B, m, keys) bool: the keys of each query's top-k `indices` (B, m, k), or None where none are given."""
    if indices is None:
        return None
    import torch

    out = torch.zeros((*indices.shape[:-1], keys), dtype=torch.bool, device=indices.device)
    return out.scatter(-1, indices.long(), True)


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


def verify_against_eager(model, input_ids, attention_mask, output, restore: str = RECORD_NAME) -> None:
    """Refuse a model whose recorded attention does not reproduce its own eager attention on this batch: the same
    batch is run again with the model's "eager" attention and the final outputs must agree on real tokens; the
    attention implementation `restore` is set again afterwards."""
    model.set_attn_implementation("eager")
    try:
        reference = model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        model.set_attn_implementation(restore)
    gap, tol = relative_gap(output, reference, attention_mask)
    if gap > tol:
        raise PosprobeError(
            f"recording the attention of '{getattr(model.config, 'model_type', 'unknown')}' changes its outputs "
            f"(relative difference {gap:.2e} from its eager attention)",
            "this family computes attention in a way posprobe attention does not reproduce; please report it",
        )


# The blockwise route: the same attention, computed and recorded a block of query rows at a time, so that no layer's
# (queries x keys) matrix, and no (m x m) mask, is ever made (SPEC §19).

BLOCK_NAME = "posprobe-blocks"
BLOCK_ELEMENTS = 2**22  # B x H x rows x keys per block: 16 MiB of float32 scores
_BLOCKS: list[BlockRecorder] = []  # the block recorder of the forward pass running now (at most one)


class RowMask:
    """What transformers' mask functions would make as a (B, 1, q, kv) mask, made one block of query rows at a time
    (`rows`) by transformers' own `sdpa_mask` with the block's query offset: the same mask function, padding and
    offsets, never the whole matrix. Returned for the model's masks by `row_mask` (the mask interface of
    `BLOCK_NAME`); only `block_attention` reads it."""

    def __init__(self, batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, options):
        self.batch_size, self.q_length, self.kv_length = batch_size, q_length, kv_length
        self.q_offset, self.kv_offset = q_offset, kv_offset
        self.mask_function, self.attention_mask, self.options = mask_function, attention_mask, options

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch_size, 1, self.q_length, self.kv_length)

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """(B, 1, stop - start, kv) bool: True where query row i (start <= i < stop) may see key j."""
        import torch
        from transformers.masking_utils import sdpa_mask

        mask = sdpa_mask(
            batch_size=self.batch_size,
            q_length=stop - start,
            kv_length=self.kv_length,
            q_offset=self.q_offset + start,
            kv_offset=self.kv_offset,
            mask_function=self.mask_function,
            attention_mask=self.attention_mask,
            allow_is_causal_skip=False,
            allow_is_bidirectional_skip=False,
            **self.options,
        )
        shape = (self.batch_size, 1, stop - start, self.kv_length)
        if mask is None:
            return torch.ones(shape, dtype=torch.bool, device=self.options.get("device", "cpu"))
        return mask.expand(shape)

    def __getitem__(self, index):
        """The mask indexed. An index that keeps every entry returns the mask itself, still made a block at a time
        (Gemma 4 slices its masks so before its layers that reuse keys: [:, :, -0:, :]); any other index reads the
        whole (B, 1, q, kv) bool mask, for a module that reads the mask itself (an indexer that scores every pair
        anyway, DeepSeek Sparse Attention's); the attention still runs in blocks of rows."""
        whole = isinstance(index, tuple) and len(index) == 4 and all(
            isinstance(s, slice) and s.start in (None, 0) and s.stop is None and s.step in (None, 1) for s in index
        )  # fmt: skip
        return self if whole else self.rows(0, self.q_length)[index]


def row_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask=None,
    **kwargs: Any,
) -> RowMask:
    """transformers' mask-interface contract for `BLOCK_NAME`: a `RowMask` instead of a (B, 1, q, kv) tensor."""
    from transformers.masking_utils import causal_mask_function

    options = {key: kwargs[key] for key in ("use_vmap", "device") if key in kwargs}
    function = causal_mask_function if mask_function is None else mask_function
    return RowMask(batch_size, q_length, kv_length, q_offset, kv_offset, function, attention_mask, options)


class BlockRecorder:
    """While active, receives every block `block_attention` computes: `hand(layer, start, S, A, allowed)` with S
    and A (B, H, b, m) of query rows start..start+b-1 and allowed (B, b, m) bool ((B, H, b, m) where each head
    picks keys of its own, `group_selected`); counts the layers (`calls`).
    `rows`: query rows per block, or None for about `BLOCK_ELEMENTS` scores per block. `hand` None: nothing is
    recorded (the first batch's check runs this way). `heads`: as `LayerRecorder`'s (S and A of a layer with fewer
    query heads get NaN heads up to H)."""

    def __init__(self, n_layers: int, hand=None, rows: int | None = None, heads: int | None = None):
        self.n_layers, self.hand, self.fixed_rows, self.heads = n_layers, hand, rows, heads
        self.m, self.calls, self.last = 0, 0, None

    def begin(self, m: int) -> None:
        self.m, self.calls, self.last = m, 0, None

    def rows(self, batch: int, heads: int, keys: int) -> int:
        if self.fixed_rows is not None:
            return self.fixed_rows
        return max(1, BLOCK_ELEMENTS // max(1, batch * heads * keys))

    def __enter__(self) -> BlockRecorder:
        _BLOCKS.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _BLOCKS.remove(self)

    def check(self, queries: int, keys: int) -> None:
        if queries != self.m or keys != self.m:
            raise PosprobeError(
                f"an attention call saw {queries} queries and {keys} keys for sequences of {self.m}",
                "only self-attention over the input (encoders and decoders, no cache, no cross-attention) is supported",
            )
        _check_call(self.calls, self.n_layers)


def _mask_rows(attention_mask, start: int, stop: int, keys: int):
    """The rows start..stop-1 of a layer's mask: a RowMask's bool rows, a tensor's slice (bool, or additive
    float), or None (no mask: every pair allowed)."""
    if attention_mask is None:
        return None
    if isinstance(attention_mask, RowMask):
        return attention_mask.rows(start, stop)[..., :keys]
    if attention_mask.dim() == 4:
        return attention_mask[:, :, start:stop, :keys]
    return attention_mask[..., start:stop, :keys]


def block_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
):
    """`recording_attention` computed one block of query rows at a time: per block, S = q_block K^T * scaling
    (softcapped when the family asks) with the mask's rows applied, A = softmax(S) in float32 (over one more sink
    logit per head with learned sinks), the block's output A V; while a `BlockRecorder` is active it gets S, A and
    the allowed pairs of every block. Row by row this is the eager computation; the largest temporary is one block
    (B, H, b, m); an indexer's top-k `indices` mask the block's other keys. Returns ((B, m, H, d_h), None)."""
    import torch

    recorder = _BLOCKS[-1] if _BLOCKS else None
    call = (module, query, key, attention_mask)
    if recorder is not None and repeats(call, recorder.last):  # the last call again: computed, not recorded
        recorder = None
    elif recorder is not None:
        recorder.last = call
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    batch, heads, m, _ = query.shape
    keys = key.shape[-2]
    if recorder is not None:
        recorder.check(m, keys)
    size = (
        recorder.rows(batch, heads, keys) if recorder is not None else max(1, BLOCK_ELEMENTS // (batch * heads * keys))
    )
    softcap, sinks, indices = kwargs.get("softcap"), kwargs.get("s_aux"), kwargs.get("indices")
    block_indices = kwargs.get("block_indices")
    out = query.new_empty(batch, heads, m, value.shape[-1])
    key_t = key.transpose(-1, -2)
    for start in range(0, m, size):
        stop = min(m, start + size)
        scores = torch.matmul(query[:, :, start:stop], key_t) * scaling  # (B, H, b, keys)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        mask = _mask_rows(attention_mask, start, stop, keys)
        if mask is not None:  # made beside the inputs; layers spread over devices (--device auto) run elsewhere
            mask = mask.to(scores.device)
        if mask is None:
            allowed = torch.ones((batch, stop - start, keys), dtype=torch.bool, device=scores.device)
        elif mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            allowed = mask[:, 0].expand(batch, stop - start, keys)
        else:
            scores = scores + mask
            allowed = (mask[:, 0] > torch.finfo(mask.dtype).min / 2).expand(batch, stop - start, keys)
        if indices is not None:  # an indexer's top-k keys per query (see `recording_attention`)
            selected = _selected(indices[:, start:stop], keys)
            scores = scores.masked_fill(~selected[:, None], torch.finfo(scores.dtype).min)
            allowed = allowed & selected
        if block_indices is not None:  # each query head's picked key blocks: allowed (B, H, b, keys)
            group = group_selected(module, block_indices[:, :, start:stop], heads, keys)
            scores = scores.masked_fill(~group, torch.finfo(scores.dtype).min)
            allowed = allowed[:, None] & group
        if sinks is not None:
            column = sinks.reshape(1, -1, 1, 1).to(scores.dtype).expand(batch, -1, stop - start, 1)
            probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1, dtype=torch.float32)[..., :-1]
            probs = probs.to(query.dtype)
        else:
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        dropped = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
        out[:, :, start:stop] = torch.matmul(dropped, value)
        if recorder is not None and recorder.hand is not None:
            padded = (absent_heads_as_nan(x, recorder.heads) for x in (scores, probs))
            recorder.hand(recorder.calls, start, *padded, allowed)
        del scores, probs, dropped, mask, allowed
    if recorder is not None:
        recorder.calls += 1
    return out.transpose(1, 2).contiguous(), None


def register_block_attention() -> None:
    """Register `block_attention` (with `row_mask` as its masks) under `BLOCK_NAME`; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(BLOCK_NAME, block_attention)
    AttentionMaskInterface.register(BLOCK_NAME, row_mask)
