"""Retrieval attention (SPEC §18): the attention weight one query token gives a span of key tokens, per layer and
head, read during an ordinary forward pass without keeping any layer's (queries x keys) matrix.

Two routes, like the rest of the capture layer:
- families whose attention goes through transformers' AttentionInterface run on the attention kernel's sdpa route
  (`posprobe.kernel`, `RETRIEVAL_NAME`, with the masks that sdpa gets): the layer's output is transformers' own
  sdpa attention (or the kernel's eager computation where the family softcaps its scores, has learned sinks, an
  indexer's top-k keys or key blocks per key-head group, those folded into a per-head mask), and beside it the
  kernel's "row" site recomputes the one query row `row` from the layer's query and keys, softmax(q_row K^T *
  scaling + mask_row) in float32 (softcapped, over one more sink column, top-k keys only where the family's are);
  `SpanAttention`, a tap there, sums it over the span: the row holds the probabilities the model uses on the
  sequence's keys, a sink's share in none of them (nor pooled entries', DeepSeek V4: run with the eager path's
  additive masks, `RETRIEVAL_ADDITIVE_NAME`, which its layers extend with those entries' bias); memory per layer
  is one (B, H, keys) row;
- the other causal families (BLOOM, Falcon, MPT, GPT-Neo, XGLM) run their own eager attention, and a
  `TorchFunctionMode` reads row `row` off each (B, H, m, m) softmax output as it is made (the matrix is the
  model's own, freed by the layer as usual; only the row is kept).

Dimensions: B batch, H query heads, H_kv key/value heads, m sequence length, d_h head size, L layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posprobe.errors import PosprobeError
from posprobe.kernel import SDPA as RETRIEVAL_NAME
from posprobe.kernel import SDPA_ADDITIVE as RETRIEVAL_ADDITIVE_NAME
from posprobe.kernel import Taps, register

if TYPE_CHECKING:
    import torch


class SpanAttention:
    """Collects, for one forward pass, the attention of query `row` on keys [start, end) of each example:
    `spans` one (start, end) per batch row. `per_layer` gets one (B, H) float64 tensor per layer, in depth order;
    with `n_heads` H, a layer with fewer query heads has NaN in the heads it lacks (Laguna, Dots3: SPEC §9)."""

    def __init__(self, row: int, spans: list[tuple[int, int]], n_layers: int, n_heads: int | None = None):
        self.row, self.spans, self.n_layers, self.n_heads = row, spans, n_layers, n_heads
        self.per_layer: list[torch.Tensor] = []

    def taps(self) -> Taps:
        """Taps that hand this reader every attention call's row on the kernel's sdpa route."""
        return Taps(row=self.row).on("row", lambda row, call: self.add_row(row))

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
            register()
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

    def forward(self, input_ids, row: int, spans: list[tuple[int, int]], taps: Taps | None = None, **kwargs):
        """The model's output on `input_ids` (B, m) and the (B, L, H) attention of query `row` on each span; `taps`:
        edits on the attention kernel, applied before the row is read (refused on the eager route)."""
        from posprobe.capture.eager import depth_attention_modules

        reader = SpanAttention(row, spans, self.n_layers, self.n_heads)
        if self.eager and taps is not None:
            raise PosprobeError(
                f"'{getattr(self.model.config, 'model_type', 'unknown')}' computes attention outside transformers' "
                "AttentionInterface, so posprobe cannot edit it",
                "use a family whose attention goes through AttentionInterface",
            )
        if self.eager:
            batch, m = input_ids.shape
            with eager_softmax_rows(reader, batch, self.n_heads, m, depth_attention_modules(self.model)):
                output = self.model(input_ids=input_ids, **kwargs)
        else:
            output = (taps.joined(reader.taps()) if taps is not None else reader.taps()).forward(
                self.model, input_ids=input_ids, **kwargs
            )
        return output, reader.result()


class TopKeys:
    """Wu et al. 2024's retrieval reading: for one forward pass, the key each query row from `Taps.row` on attends
    most, per layer and head, read on the kernel's "rows" site (after any edit; beside sdpa's output, whose numbers
    stay those of a plain run) over the sequence's own keys. `take()` returns (B, L, H, m - row) int64 (-1 for
    heads a layer lacks) and starts over for the next pass."""

    def __init__(self, n_layers: int, n_heads: int):
        self.n_layers, self.n_heads = n_layers, n_heads
        self.per_layer: dict[int, list] = {}

    def taps(self) -> Taps:
        return Taps().on("rows", self.add_rows)

    def add_rows(self, probs, call) -> None:
        """probs (B, H, r, own) of one call's query rows from `Taps.row` on."""
        if call.repeated:  # the same softmax read twice (DiffLlama's second use): keep the first
            return
        self.per_layer.setdefault(call.index, []).append(probs.argmax(-1).cpu())  # (B, H, r)

    def reset(self) -> None:
        self.per_layer = {}

    def take(self):
        import torch

        layers = [torch.cat(blocks, dim=-1) for _, blocks in sorted(self.per_layer.items())]
        self.per_layer = {}
        if len(layers) != self.n_layers:
            raise PosprobeError(
                f"the forward pass made {len(layers)} attention calls for {self.n_layers} layers",
                "this family computes attention in a way posprobe needle does not read; please report it",
            )
        batch, _, m = layers[0].shape
        out = torch.full((batch, self.n_layers, self.n_heads, m), -1, dtype=torch.int64)
        for i, top in enumerate(layers):
            out[:, i, : top.shape[1]] = top
        return out.numpy()
