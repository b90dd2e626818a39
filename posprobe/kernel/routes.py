"""The attention kernel: the one function posprobe registers in transformers' `AttentionInterface` to observe or
edit attention, and the one place that computes an attention softmax for recording, retrieval or editing.

It computes what the family's own attention computes (scaling, the mask/bias argument — padding, causality, sliding
windows, relative biases or ALiBi where a family passes them there —, grouped-query heads, softcapping, learned
sink logits `s_aux`, an indexer's top-k `indices`, key blocks picked per key-head group `block_indices`) and hands
each named site to the `Taps` the forward pass carries (`kernel.taps`). It is registered under four names, one per
route; a route is the output computation and the masks transformers makes for it:

- `EAGER` ("posprobe-record"): the eager computation, S = QKᵀ·scaling + mask, A = softmax(S) in float32 cast back,
  A·V; the stock `eager_mask` (additive masks, exactly the eager path's);
- `SDPA` ("posprobe-retrieval"): transformers' own sdpa attention with sdpa's masks (the eager computation where
  the family softcaps, has sinks or indexed keys, which sdpa drops, or where a tap reads or edits scores/pattern);
  the "row" site is one query row recomputed beside it;
- `SDPA_ADDITIVE` ("posprobe-retrieval-additive"): the same with the eager path's additive masks (a family that
  appends pooled entries to its keys extends a tensor mask with their bias, DeepSeek V4);
- `BLOCKS` ("posprobe-blocks", SPEC §19): the eager computation one block of query rows at a time, its masks
  `RowMask`s (transformers' mask function evaluated for a block's rows only): no (m x m) tensor is made.

With no taps each route returns its model's usual output. `verify_against_eager` is the first-batch check of a run
on the kernel: the same batch through the model's own eager attention must give the same outputs.

Dimensions: B batch, H query heads, H_kv key/value heads, m sequence length, d_h head size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posprobe.errors import PosprobeError
from posprobe.kernel.taps import TAPS_KEY, Call, Taps

if TYPE_CHECKING:
    import torch

EAGER = "posprobe-record"
SDPA = "posprobe-retrieval"
SDPA_ADDITIVE = "posprobe-retrieval-additive"
BLOCKS = "posprobe-blocks"
BLOCK_ELEMENTS = 2**22  # B x H x rows x keys per block: 16 MiB of float32 scores


def attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    *,
    route: str = EAGER,
    **kwargs: Any,
):
    """transformers' attention-function contract on route `route` (EAGER, SDPA or BLOCKS; how the registered
    names bind it): query (B, H, m, d_h), key/value (B, H_kv, keys, d_h), attention_mask as that route's masks
    make it. Returns ((B, m, H, d_h), A (B, H, m, keys) on the eager route, else None). The `Taps` of the forward
    pass, if any, arrive as keyword `posprobe_taps`."""
    taps: Taps | None = kwargs.pop(TAPS_KEY, None)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    call = taps.enter(module, query, key, attention_mask) if taps is not None else None
    if call is not None:
        query = taps.apply("query", query, call)
        key = taps.apply("key", key, call)
        call.own = own_keys(module, query, key)
        if taps.wants("mask"):
            attention_mask = call.mask = taps.apply("mask", attention_mask, call)
    probs = None
    if route == BLOCKS or isinstance(attention_mask, RowMask):
        out = _blocks(module, query, key, value, attention_mask, scaling, dropout, kwargs, taps, call)
    elif route == EAGER:
        out, probs = _whole(module, query, key, value, attention_mask, scaling, dropout, kwargs, taps, call)
    else:
        out = _sdpa(module, query, key, value, attention_mask, scaling, dropout, kwargs, taps, call)
    if call is not None and taps.wants("head_output"):
        out = taps.apply("head_output", out, call)
    return out, probs


def _repeat_heads(query, key, value):
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    return key, value


def _with_sinks(scores, sinks, dtype):
    """softmax(S) in float32 cast to `dtype`, over one more sink logit per head where `sinks` (H,) are given (A
    then keeps the real keys' columns)."""
    import torch

    if sinks is None:
        return torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
    column = sinks.reshape(1, -1, 1, 1).to(scores.dtype).expand(scores.shape[0], -1, scores.shape[-2], 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1, dtype=torch.float32)[..., :-1].to(dtype)


def _whole(module, query, key, value, attention_mask, scaling, dropout, kwargs, taps, call):
    """The eager computation on whole (m x keys) matrices, with the "scores" and "pattern" taps.

    S = QKᵀ·scaling (softcapped when the family asks), plus the mask/bias; top-k `indices` (B, m, k) mask every
    other key as the eager path does (the dtype's minimum), key blocks picked per key-head group (`block_indices`)
    each query head's other keys; A = softmax(S) in float32 (over one more sink column with learned sinks `s_aux`:
    rows sum to one less the sink's share). `call.selected`: the indexed keys, per head with block indices."""
    import torch

    key, value = _repeat_heads(query, key, value)
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
    if call is not None:
        call.selected = selected
        scores = taps.apply("scores", scores, call)
        call.scores = scores
    probs = _with_sinks(scores, kwargs.get("s_aux"), query.dtype)
    if call is not None:
        probs = taps.apply("pattern", probs, call)
        call.pattern = probs
    dropped = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(dropped, value).transpose(1, 2).contiguous(), probs


def _sdpa(module, query, key, value, attention_mask, scaling, dropout, kwargs, taps, call):
    """transformers' sdpa attention (or `_whole` where the family softcaps, has sinks, top-k indices or key blocks,
    which sdpa would drop, or a tap reads or edits scores or the pattern; key blocks folded into a per-head mask);
    the "row" taps get query row `taps.row`'s probabilities on the sequence's keys, the "rows" taps those of the
    rows from `taps.row` to the last (`row_probabilities`, or the rows of the pattern computed with edits)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs = dict(kwargs)
    blocks = kwargs.pop("block_indices", None)
    if blocks is not None:  # key blocks picked per key-head group: folded into a per-head mask
        attention_mask = _with_group_blocks(module, query, key, attention_mask, blocks)
    softcap, sinks, indices = kwargs.get("softcap"), kwargs.get("s_aux"), kwargs.get("indices")
    edits = call is not None and (taps.wants("scores") or taps.wants("pattern"))
    if softcap is not None or sinks is not None or indices is not None or blocks is not None or edits:
        mask = attention_mask
        if mask is None and getattr(module, "is_causal", True):  # sdpa's causal shortcut: written out (a
            # bidirectional module's None is no mask at all, as sdpa reads it)
            queries, keys = query.shape[-2], key.shape[-2]
            mask = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(keys - queries)[None, None]
        out, _ = _whole(module, query, key, value, mask, scaling, dropout, kwargs, taps, call)
    else:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)  # fmt: skip
    if call is not None and taps.wants("row"):
        if edits:  # the pattern the call computed, its edits included
            row = call.pattern[:, :, taps.row].float()
        else:
            row = row_probabilities(query, key, attention_mask, taps.row, scaling, softcap, sinks, indices)
        taps.apply("row", row[..., : call.own], call)  # pooled entries after the keys are no tokens
    if call is not None and taps.wants("rows") and taps.row is not None:
        if edits:
            rows = call.pattern[:, :, taps.row :].float()
        else:
            rows = row_probabilities(query, key, attention_mask, taps.row, scaling, softcap, sinks, indices,
                                     stop=query.shape[-2])  # fmt: skip
        taps.apply("rows", rows[..., : call.own], call)
    if call is not None:
        call.pattern = None
    return out


def _blocks(module, query, key, value, attention_mask, scaling, dropout, kwargs, taps, call):
    """`_whole` computed one block of query rows at a time: per block, S = q_block Kᵀ·scaling (softcapped) with the
    mask's rows applied, A = softmax(S) in float32 (over one more sink logit per head with learned sinks), the
    block's output A·V; the "scores" and "pattern" taps get each block (`call.rows`, `call.allowed`). Row by row
    this is the eager computation; the largest temporary is one block (B, H, b, keys). Returns (B, m, H, d_h)."""
    import torch

    key, value = _repeat_heads(query, key, value)
    batch, heads, m, _ = query.shape
    keys = key.shape[-2]
    fixed = taps.block_rows if taps is not None else None
    size = fixed if fixed is not None else max(1, BLOCK_ELEMENTS // max(1, batch * heads * keys))
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
            _check_mask_columns(mask, keys)
        if mask is None:
            allowed = torch.ones((batch, stop - start, keys), dtype=torch.bool, device=scores.device)
        elif mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            allowed = mask[:, 0].expand(batch, stop - start, keys)
        else:
            scores = scores + mask
            allowed = (mask[:, 0] > torch.finfo(mask.dtype).min / 2).expand(batch, stop - start, keys)
        if indices is not None:  # an indexer's top-k keys per query
            selected = _selected(indices[:, start:stop], keys)
            scores = scores.masked_fill(~selected[:, None], torch.finfo(scores.dtype).min)
            allowed = allowed & selected
        if block_indices is not None:  # each query head's picked key blocks: allowed (B, H, b, keys)
            group = group_selected(module, block_indices[:, :, start:stop], heads, keys)
            scores = scores.masked_fill(~group, torch.finfo(scores.dtype).min)
            allowed = allowed[:, None] & group
        if call is not None:
            call.rows, call.allowed = (start, stop), allowed
            scores = taps.apply("scores", scores, call)
            call.scores = scores
        probs = _with_sinks(scores, sinks, query.dtype)
        if call is not None:
            probs = taps.apply("pattern", probs, call)
            call.scores = call.allowed = None
        dropped = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
        out[:, :, start:stop] = torch.matmul(dropped, value)
        del scores, probs, dropped, mask, allowed
    return out.transpose(1, 2).contiguous()


def row_probabilities(
    query,
    key,
    attention_mask,
    row: int,
    scaling: float,
    softcap: float | None = None,
    sinks=None,
    indices=None,
    stop: int | None = None,
):
    """(B, H, keys) float32: the probabilities query row `row` gives the keys, as eager attention computes them;
    with `stop`, those of the query rows row..stop-1, (B, H, stop - row, keys).

    query (B, H, m, d_h), key (B, H_kv, keys, d_h); attention_mask None (sdpa's causal shortcut: query i sees keys
    0..i), bool (B or 1, 1, m, keys) (True = attend), or additive float of that shape. sinks: learned per-head sink
    logits (H,) (gpt-oss's `s_aux`): one more softmax column with no key, left out of the row, which then sums to
    one less the sink's share. indices (B, m, k): an indexer's top-k keys per query (DeepSeek Sparse Attention),
    every other key masked."""
    import torch

    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
    last = row + 1 if stop is None else stop
    q = query[:, :, row:last, :]  # (B, H, r, d_h)
    scores = torch.matmul(q.float(), key.float().transpose(-1, -2)) * scaling  # (B, H, r, keys)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    keys = key.shape[-2]
    if attention_mask is None:
        allowed = (
            torch.arange(keys, device=scores.device)[None, :] <= torch.arange(row, last, device=scores.device)[:, None]
        )
        scores = scores.masked_fill(~allowed, float("-inf"))
    else:
        mask_rows = attention_mask[:, :, row:last, :keys]  # (B or 1, 1, r, keys)
        if mask_rows.dtype == torch.bool:
            scores = scores.masked_fill(~mask_rows, float("-inf"))
        else:
            scores = scores + mask_rows.float()
    if indices is not None:
        selected = _selected(indices[:, row:last], keys)  # (B, r, keys)
        scores = scores.masked_fill(~selected[:, None], float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1)
    else:
        column = sinks.reshape(1, -1, 1, 1).float().expand(scores.shape[0], -1, scores.shape[2], 1)
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    return probs[:, :, 0] if stop is None else probs


def own_keys(module, query, key) -> int:
    """How many keys of a call are the sequence's own tokens: all, or, where the family appends entries pooled over
    blocks of tokens after them (`Family.tensors['pooled_keys']`: DeepSeek V4's compressed layers), the first m, as
    many as the queries (a run on the kernel uses no cache)."""
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


def _with_group_blocks(module, query, key, attention_mask, block_indices):
    """The layer's mask with the key blocks its indexer picked per key-head group folded in: additive (B, H, m,
    keys) in the query's dtype (the dtype's minimum where masked), from a bool, additive or None (causal) mask."""
    import torch

    queries, keys = query.shape[-2], key.shape[-2]
    if attention_mask is None:  # sdpa's causal shortcut
        attention_mask = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(keys - queries)
        attention_mask = attention_mask[None, None]
    picked = group_selected(module, block_indices, query.shape[1], keys)
    lowest = torch.tensor(torch.finfo(query.dtype).min, dtype=query.dtype, device=query.device)
    mask = attention_mask[..., :keys]
    additive = torch.where(mask, torch.zeros_like(lowest), lowest) if mask.dtype == torch.bool else mask.to(query.dtype)
    return torch.where(picked, additive, lowest)


class RowMask:
    """What transformers' mask functions would make as a (B, 1, q, kv) mask, made one block of query rows at a time
    (`rows`) by transformers' own `sdpa_mask` with the block's query offset: the same mask function, padding and
    offsets, never the whole matrix. Returned for the model's masks by `row_mask` (the mask interface of `BLOCKS`);
    only the kernel's blockwise route reads it."""

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
    """transformers' mask-interface contract for `BLOCKS`: a `RowMask` instead of a (B, 1, q, kv) tensor."""
    from transformers.masking_utils import causal_mask_function

    options = {key: kwargs[key] for key in ("use_vmap", "device") if key in kwargs}
    function = causal_mask_function if mask_function is None else mask_function
    return RowMask(batch_size, q_length, kv_length, q_offset, kv_offset, function, attention_mask, options)


def _check_mask_columns(mask, keys: int) -> None:
    """A row mask must cover every key. A family that appends entries to its keys and extends a tensor mask with
    their bias in its own code (DeepSeek V4's pooled entries) cannot extend a `RowMask`: refused, not misread."""
    if mask.shape[-1] < keys:
        raise PosprobeError(
            f"its layers append {keys - mask.shape[-1]} entries to the keys and extend a whole mask to them in the "
            "model's own code, which a mask made a block of rows at a time cannot follow"
        )


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


def _bound(route: str):
    def kernel(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        return attention(module, query, key, value, attention_mask, scaling, dropout, route=route, **kwargs)

    kernel.__name__ = kernel.__qualname__ = f"posprobe_kernel_{route.rsplit('-', 1)[-1]}"
    return kernel


def register() -> None:
    """Register the kernel under its four route names, each with its masks (eager, sdpa, eager, row masks);
    idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    for name, masks in ((EAGER, eager_mask), (SDPA, sdpa_mask), (SDPA_ADDITIVE, eager_mask), (BLOCKS, row_mask)):
        AttentionInterface.register(name, _ROUTES[name])
        AttentionMaskInterface.register(name, masks)


_ROUTES = {name: _bound(name if name != SDPA_ADDITIVE else SDPA) for name in (EAGER, SDPA, SDPA_ADDITIVE, BLOCKS)}


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


def verify_against_eager(model, input_ids, attention_mask, output, restore: str = EAGER) -> None:
    """Refuse a model whose attention on the kernel does not reproduce its own eager attention on this batch: the
    same batch is run again with the model's "eager" attention and the final outputs must agree on real tokens; the
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


__all__ = ["BLOCKS", "EAGER", "SDPA", "SDPA_ADDITIVE", "Call", "RowMask", "Taps", "attention", "register"]
