"""Retrieval attention (SPEC §18): the attention weight one query token gives a span of key tokens, per layer and
head, read during an ordinary forward pass without keeping any layer's (queries x keys) matrix.

Two routes, like the rest of the capture layer:
- families whose attention goes through transformers' AttentionInterface run `retrieval_attention`, registered as
  `RETRIEVAL_NAME` with the masks that sdpa gets: the layer's output is transformers' own sdpa attention (or the
  eager computation of `capture.recording` where the family softcaps its scores, has learned sinks, an indexer's
  top-k keys or key blocks per key-head group, those folded into a per-head mask), and beside it the one query
  row `row` is recomputed from the layer's query and keys, softmax(q_row K^T * scaling + mask_row) in float32
  (softcapped, over one more sink column, top-k keys only where the family's are), and summed over the span: the
  row holds the probabilities the model uses on the sequence's keys, a sink's share in none of them (nor pooled
  entries', DeepSeek V4: run with the eager path's additive masks, `RETRIEVAL_ADDITIVE_NAME`, which its layers
  extend with those entries' bias); memory per layer is one (B, H, keys) row;
- the other causal families (BLOOM, Falcon, MPT, GPT-Neo, XGLM) run their own eager attention, and a
  `TorchFunctionMode` reads row `row` off each (B, H, m, m) softmax output as it is made (the matrix is the
  model's own, freed by the layer as usual; only the row is kept).

Dimensions: B batch, H query heads, H_kv key/value heads, m sequence length, d_h head size, L layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posprobe.errors import PosprobeError

if TYPE_CHECKING:
    import torch

RETRIEVAL_NAME = "posprobe-retrieval"
# the same function with the eager path's additive masks: for families that append pooled entries to a layer's keys
# (DeepSeek V4), whose layers extend a tensor mask with the entries' own bias (sdpa's masks may be None or bool)
RETRIEVAL_ADDITIVE_NAME = "posprobe-retrieval-additive"
_ACTIVE: list[SpanAttention] = []  # the reader of the forward pass running now (at most one)


class SpanAttention:
    """Collects, for one forward pass, the attention of query `row` on keys [start, end) of each example:
    `spans` one (start, end) per batch row. `per_layer` gets one (B, H) float64 tensor per layer, in depth order;
    with `n_heads` H, a layer with fewer query heads has NaN in the heads it lacks (Laguna, Dots3: SPEC §9)."""

    def __init__(self, row: int, spans: list[tuple[int, int]], n_layers: int, n_heads: int | None = None):
        self.row, self.spans, self.n_layers, self.n_heads = row, spans, n_layers, n_heads
        self.per_layer: list[torch.Tensor] = []

    def __enter__(self) -> SpanAttention:
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)

    def add_row(self, probs_row: torch.Tensor) -> None:
        """probs_row (B, H, keys): the attention probabilities of query `row`; keeps their sums over each span."""
        if len(self.per_layer) >= self.n_layers:
            raise PosprobeError(
                f"the model ran more attention calls than it has layers ({self.n_layers})",
                "models with several attention stacks are not supported by posprobe needle",
            )
        import torch

        from posprobe.capture.recording import absent_heads_as_nan

        sums = [probs_row[b, :, start:end].double().sum(-1) for b, (start, end) in enumerate(self.spans)]
        self.per_layer.append(absent_heads_as_nan(torch.stack(sums), self.n_heads))

    def result(self) -> torch.Tensor:
        """(B, L, H) float64: attention of query `row` on each example's span, per layer and head."""
        import torch

        if len(self.per_layer) != self.n_layers:
            raise PosprobeError(
                f"the forward pass made {len(self.per_layer)} attention calls for {self.n_layers} layers",
                "this family computes attention in a way posprobe needle does not read; please report it",
            )
        return torch.stack(self.per_layer, dim=1)


def row_probabilities(
    query, key, attention_mask, row: int, scaling: float, softcap: float | None = None, sinks=None, indices=None
):
    """(B, H, keys) float32: the probabilities query row `row` gives the keys, as eager attention computes them.

    query (B, H, m, d_h), key (B, H_kv, keys, d_h); attention_mask None (sdpa's causal shortcut: query i sees keys
    0..i), bool (B or 1, 1, m, keys) (True = attend), or additive float of that shape. sinks: learned per-head sink
    logits (H,) (gpt-oss's `s_aux`): one more softmax column with no key, left out of the row, which then sums to
    one less the sink's share. indices (B, m, k): an indexer's top-k keys per query (DeepSeek Sparse Attention),
    every other key masked."""
    import torch

    from posprobe.capture.recording import _selected

    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
    q = query[:, :, row : row + 1, :]  # (B, H, 1, d_h)
    scores = torch.matmul(q.float(), key.float().transpose(-1, -2))[:, :, 0, :] * scaling  # (B, H, keys)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    keys = key.shape[-2]
    if attention_mask is None:
        allowed = torch.arange(keys, device=scores.device) <= row
        scores = scores.masked_fill(~allowed, float("-inf"))
    else:
        mask_row = attention_mask[:, :, row, :keys]  # (B or 1, 1, keys)
        if mask_row.dtype == torch.bool:
            scores = scores.masked_fill(~mask_row, float("-inf"))
        else:
            scores = scores + mask_row.float()
    if indices is not None:
        selected = _selected(indices[:, row : row + 1], keys)  # (B, 1, keys)
        scores = scores.masked_fill(~selected, float("-inf"))
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    column = sinks.reshape(1, -1, 1).float().expand(scores.shape[0], -1, 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


def retrieval_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
):
    """transformers' attention-function contract: returns the family's usual output ((B, m, H, d_h), None) and,
    while a `SpanAttention` is active, hands it the probabilities of its query row."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from posprobe.capture.recording import own_keys, recording_attention

    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    kwargs = dict(kwargs)
    blocks = kwargs.pop("block_indices", None)
    if blocks is not None:  # key blocks picked per key-head group: folded into a per-head mask
        attention_mask = _with_group_blocks(module, query, key, attention_mask, blocks)
    softcap, sinks, indices = kwargs.get("softcap"), kwargs.get("s_aux"), kwargs.get("indices")
    # sdpa has none of these (it would drop them): recording computes them as eager attention does
    if softcap is not None or sinks is not None or indices is not None or blocks is not None:
        mask = attention_mask
        if mask is None:  # sdpa's causal shortcut: the eager computation needs the causal mask written out
            queries, keys = query.shape[-2], key.shape[-2]
            mask = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(keys - queries)[None, None]
        out, _ = recording_attention(module, query, key, value, mask, scaling, dropout, **kwargs)
    else:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)  # fmt: skip
    if _ACTIVE:
        reader = _ACTIVE[-1]
        row = row_probabilities(query, key, attention_mask, reader.row, scaling, softcap, sinks, indices)
        reader.add_row(row[..., : own_keys(module, query, key)])  # pooled entries after the keys are no tokens
    return out, None


def _with_group_blocks(module, query, key, attention_mask, block_indices):
    """The layer's mask with the key blocks its indexer picked per key-head group folded in: additive (B, H, m,
    keys) in the query's dtype (the dtype's minimum where masked), from a bool, additive or None (causal) mask; the
    picked keys are `recording.group_selected`'s, which refuses a layer that names no block size."""
    import torch

    from posprobe.capture.recording import group_selected

    queries, keys = query.shape[-2], key.shape[-2]
    if attention_mask is None:  # sdpa's causal shortcut
        attention_mask = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(keys - queries)
        attention_mask = attention_mask[None, None]
    picked = group_selected(module, block_indices, query.shape[1], keys)
    lowest = torch.tensor(torch.finfo(query.dtype).min, dtype=query.dtype, device=query.device)
    mask = attention_mask[..., :keys]
    additive = torch.where(mask, torch.zeros_like(lowest), lowest) if mask.dtype == torch.bool else mask.to(query.dtype)
    return torch.where(picked, additive, lowest)


def register_retrieval_attention() -> None:
    """Register `retrieval_attention` under `RETRIEVAL_NAME` (with sdpa's masks) and `RETRIEVAL_ADDITIVE_NAME` (with
    the eager path's additive masks); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    AttentionInterface.register(RETRIEVAL_NAME, retrieval_attention)
    AttentionMaskInterface.register(RETRIEVAL_NAME, sdpa_mask)
    AttentionInterface.register(RETRIEVAL_ADDITIVE_NAME, retrieval_attention)
    AttentionMaskInterface.register(RETRIEVAL_ADDITIVE_NAME, eager_mask)


def retrieval_route(model) -> str:
    """The attention implementation a retrieval run sets: `RETRIEVAL_ADDITIVE_NAME` for a family that appends
    entries pooled over blocks of tokens to its keys (`Family.tensors['pooled_keys']`: their bias joins the mask
    only where it is an additive tensor), else `RETRIEVAL_NAME`."""
    from posprobe.families import family_for_type

    family = family_for_type(str(getattr(model.config, "model_type", "")))
    return RETRIEVAL_ADDITIVE_NAME if family is not None and "pooled_keys" in family.tensors else RETRIEVAL_NAME


def eager_softmax_rows(reader: SpanAttention, batch: int, heads: int, m: int, outside=()):
    """A TorchFunctionMode that hands `reader` row `reader.row` of every softmax over the keys of a (batch, H, m, m)
    tensor (or a (batch * H, m, m) one) made while it is active, none inside the modules `outside` (softmaxes over
    depth: `eager.depth_attention_modules`); it changes nothing."""
    from posprobe.capture.eager import observe_attention_softmaxes

    return observe_attention_softmaxes(batch, heads, m, lambda x, out: reader.add_row(out[:, :, reader.row, :]),
                                       outside)  # fmt: skip


class RetrievalRun:
    """Switches a causal LM to the route that reads retrieval attention (`start`), runs forward passes that return
    (output, (B, L, H) span attention) (`forward`), and restores the model's attention implementation (`stop`)."""

    def __init__(self, model, n_layers: int, n_heads: int):
        from posprobe.capture.eager import is_eager_route

        self.model, self.n_layers, self.n_heads = model, n_layers, n_heads
        self.eager = is_eager_route(model)
        self.previous = getattr(model.config, "_attn_implementation", None)

    def __enter__(self) -> RetrievalRun:
        if not self.eager:
            register_retrieval_attention()
        wanted = "eager" if self.eager else retrieval_route(self.model)
        if self.previous != wanted:
            self.model.set_attn_implementation(wanted)
        if getattr(self.model.config, "_attn_implementation", None) != wanted:  # transformers says it cannot switch
            kind = getattr(self.model.config, "model_type", "unknown")
            where = "its eager attention" if self.eager else "posprobe's row-reading attention"
            raise PosprobeError(
                f"'{kind}' was loaded with {self.previous} attention and cannot switch to {where}, the only path whose "
                "attention rows can be read (its class does not run attention through transformers' "
                "AttentionInterface)",
                "load it with attn_implementation='eager'"
                if self.eager
                else "load it with a transformers version whose class for it switches attention",
            )
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None and self.previous != getattr(self.model.config, "_attn_implementation", None):
            self.model.set_attn_implementation(self.previous)

    def forward(self, input_ids, row: int, spans: list[tuple[int, int]], **kwargs):
        """The model's output on `input_ids` (B, m) and the (B, L, H) attention of query `row` on each span."""
        from posprobe.capture.eager import depth_attention_modules

        reader = SpanAttention(row, spans, self.n_layers, self.n_heads)
        with reader:
            if self.eager:
                batch, m = input_ids.shape
                with eager_softmax_rows(reader, batch, self.n_heads, m, depth_attention_modules(self.model)):
                    output = self.model(input_ids=input_ids, **kwargs)
            else:
                output = self.model(input_ids=input_ids, **kwargs)
        return output, reader.result()
