"""The one model reader: `ModelContext` sees one checkpoint through its family entry and gives canonical tensors.

Everything that knows where a family keeps a tensor, how its Q/K are laid out, which norm it applies with which
epsilon, how it scales and caps scores, and whether posprobe can analyse it, lives here and in the family table
(`posprobe.architectures.table`), with its helpers: `sizes` (config sizes), `embeddings` (the embedding level),
`layouts` (fused Q/K/V) and `windows` (each layer's kind). The score modules (`SCORE_MODULES`) read only
through a context.

Shapes: d hidden width, e embedding width (e != d for factorised embeddings: ALBERT, ELECTRA-small), H query
heads, H_kv key/value heads (grouped-query attention: query head h reads key head h // (H / H_kv)), d_h head size,
n positions. Canonical per-head weights: q_h = x @ W_Q[h] + b_Q[h] with W_Q (H, d, d_h), b_Q (H, d_h).
"""

from __future__ import annotations

import importlib
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from posprobe.architectures import table as T
from posprobe.architectures.config import (
    MIXED_HINT,
    Shape,
    config_hint,
    config_shape,
    config_size,
    config_where,
    mixed_checkpoint,
    query_heads_per_layer,
    reserved_rows,
    unlisted_type_error,
)
from posprobe.architectures.table import config_default
from posprobe.errors import PosprobeError
from posprobe.families.altup import altup_input
from posprobe.families.embeddings import EmbeddingReader, PositionTable, apply_norm
from posprobe.families.kv_sharing import key_source
from posprobe.families.language_model import language_model_view
from posprobe.families.layouts import grouped_conv_dense, head_split, split_fused

# The module that computes each position kind's content-free scores (see `posprobe.families` for its interface).
SCORE_MODULES = {
    T.LEARNED: "posprobe.families.absolute",
    T.SINUSOIDAL: "posprobe.families.absolute",
    T.ROTARY: "posprobe.families.rotary",
    T.ALIBI: "posprobe.families.alibi",
    T.BUCKET_BIAS: "posprobe.families.relative_bias",
    T.DISENTANGLED: "posprobe.families.disentangled",
    T.NOPE: "posprobe.families.rotary",  # rotary scores without rotation: every layer a NoPE layer
    T.RELATIVE_LOGITS: "posprobe.families.relative_logits",
    T.RELATIVE_SINUSOIDAL: "posprobe.families.relative_sinusoidal",
}


# Re-exported: where callers have always found them.
__all__ = ["STACKS", "CONTENT_FREE", "HeadWeights", "LayerInputs", "ModelContext", "PositionTable", "Shape",
           "apply_norm", "check_analysable", "config_default", "config_shape", "config_size", "content_free_scores",
           "head_split", "mixed_checkpoint", "reserved_rows"]  # fmt: skip

if TYPE_CHECKING:
    from posprobe.checkpoint.resolve import ModelSource

STACKS = ("encoder", "decoder")


@dataclass(frozen=True)
class HeadWeights:
    """Q/K projections of one attention layer per head: q_h = x @ wq[h] + bq[h], k_g = x @ wk[g] + bk[g].

    `wq` (H, d, d_h), `bq` (H, d_h), `wk` (H_kv, d, d_h), `bk` (H_kv, d_h) (zeros where the checkpoint stores no
    bias); `stored_layer` the stored layer they came from (0 at every ALBERT depth)."""

    wq: np.ndarray
    bq: np.ndarray
    wk: np.ndarray
    bk: np.ndarray
    stored_layer: int

    def queries(self, x: np.ndarray) -> np.ndarray:
        """Queries of input rows x (..., d): (H, ..., d_h)."""
        return _project(x, self.wq, self.bq)

    def keys(self, x: np.ndarray) -> np.ndarray:
        """Keys of input rows x (..., d): (H_kv, ..., d_h)."""
        return _project(x, self.wk, self.bk)

    def linear(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(wq, bq, wk, bk) in torch Linear layout: W (H d_h, d), b (H d_h,)."""

        def flat(w, b):
            return np.ascontiguousarray(w.transpose(0, 2, 1).reshape(-1, w.shape[1])), b.reshape(-1)

        return (*flat(self.wq, self.bq), *flat(self.wk, self.bk))


@dataclass(frozen=True, eq=False)
class LayerInputs:
    """Data-conditioned layer inputs (SPEC §13), an argument of the score functions (never state of the reader):
    `rows[l]` is the hidden state entering depth l, x_l (d,) the same at every position ('mean') or x_l(i) (n, d)
    one row per analysed position ('position-mean'), as transformers' `hidden_states[l]` (the residual stream
    before the layer's own norm). Read-only float64 copies; `ModelContext.layer_inputs` checks the width d."""

    rows: Mapping[int, np.ndarray]

    def __post_init__(self):
        rows = {}
        for layer, x in self.rows.items():
            x = np.array(x, dtype=np.float64)  # a copy: the caller's array can change, these cannot
            x.setflags(write=False)
            rows[int(layer)] = x
        if len({x.shape[-1] for x in rows.values()}) > 1 or not {x.ndim for x in rows.values()} <= {1, 2}:
            raise ValueError("layer inputs must be (d,) or (n, d), with one d for every layer")
        object.__setattr__(self, "rows", rows)

    @property
    def per_position(self) -> bool:
        """True when the inputs differ along the sequence (SPEC §13 'position-mean')."""
        return any(x.ndim == 2 for x in self.rows.values())

    def at(self, layer: int) -> np.ndarray:
        """Rows (m, d) entering `layer`: m = 1 for an input that is the same at every position."""
        if layer not in self.rows:
            raise ValueError(f"no data-conditioned input was given for layer {layer}")
        return np.atleast_2d(self.rows[layer])


def _project(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    # rows (T, d) go through BLAS (one (T, d) x (d, d_h) product per head); other shapes through einsum
    out = np.matmul(x[None], w) if x.ndim == 2 else np.einsum("...d,hde->h...e", x, w)
    return out + b.reshape(b.shape[0], *([1] * (x.ndim - 1)), b.shape[1])


# ------------------------------------------------------------------------------------------ context
class ModelContext(EmbeddingReader):
    """One checkpoint seen through its family entry: `source`, `reader` (a WeightReader, StateDictReader or any
    reader with `get`, `find_suffix`, `row_mean`, `shape`, `stored_dtype`: float64 numpy), `family`, `config`,
    `shape`, `kind` (its position kind, config switches included), `mode` ('paper' or 'faithful': how an
    absolute table's scores are formed, SPEC §3; the other kinds give SPEC §9's content-free scores).

    Stateless: what a score is computed from (data-conditioned `LayerInputs`, SPEC §13) is an argument of the score
    functions, never written into the reader; `cache` is a pure memo of values that depend on the checkpoint alone
    (rotary angles, ALiBi biases, layer kinds, the paper-mode table inputs), so it never changes a result.

    Creating one refuses, with one clear line, a model posprobe cannot analyse. Its embedding level (what the first
    layer receives) comes from `posprobe.families.embeddings.EmbeddingReader`."""

    def __init__(self, source: ModelSource, reader, mode: str = "paper", stack: str = "encoder"):
        source, reader = language_model_view(source, reader)  # a multimodal wrapper: its language model alone
        self.source, self.reader, self.mode = source, reader, mode
        family = check_analysable(source)
        self.family = T.stack_family(family, stack)  # `for_stack`: a decoder read through fields of its own
        self.kind = T.position_kind(source.config)[0] if self.family is family else self.family.kind
        self.config = T.stack_sizes(self.family, source.config)  # the read stack's sizes first (Whisper's decoder)
        self.shape = config_shape(self.config, source.name, self.family)
        self.qkv = T.qkv_layout(self.family, self.config)[0]
        self.cache: dict = {}  # a pure memo: what score functions compute once for every layer (rotary angles)
        self._check_layer_count()

    def _check_layer_count(self) -> None:
        """The config's layer count L must be the weights': where layer 0's query weight is found but layer
        L - 1's is not, the config claims layers the checkpoint lacks (2**31 from a crafted file had every
        analysis loop over them before reading a weight). A reader whose `layers_checked` is true (GGUF: checked
        against the file's `blk.N` tensors when it was resolved) is not asked, so no weight is opened here."""
        if getattr(self.reader, "layers_checked", False):
            return
        query, last = self.family.query + ".weight", self.stored_layer(self.shape.layers - 1)
        if self.family.hybrid:  # only the attention layers hold a query weight
            from posprobe.families.windows import attention_layers

            last = self.stored_layer(max(attention_layers(self), default=0))
        if last == 0 or self.key(query, 0) is None or self.key(query, last) is not None:
            return
        held = next(n for n in range(1, last + 1) if self.key(query, n) is None)  # first missing layer
        raise PosprobeError(
            f"{config_where(self.source.name)} gives {self.shape.layers} layers, but the weights hold the query "
            f"weights of layers 0..{held - 1} only",
            config_hint(self.source.name, MIXED_HINT),
        )

    def for_stack(self, stack: str) -> ModelContext:
        """The reader of `stack`: this one, or where the entry reads an encoder-decoder's decoder through fields of
        its own (`Family.decoder_stack`: other names, sizes, position table, mechanism), a reader of the same
        checkpoint through the entry as it reads that stack (`table.stack_family`); made once."""
        family = T.stack_family(self.family, stack)
        if family is self.family:
            return self
        key = ("stack", stack)
        if key not in self.cache:
            if self.key(family.query + ".weight", 0) is None:  # Funnel's base model: no upsampling decoder
                raise PosprobeError(
                    f"'{self.source.name}' ({self.source.model_type}) holds no {stack} weights (no "
                    f"{family.query.replace('{l}', '0')}.weight)",
                    f"drop --stack {stack}",
                )
            self.cache[key] = ModelContext(self.source, self.reader, self.mode, stack)
        return self.cache[key]

    # -- what the model is --------------------------------------------------------------------------
    @property
    def has_table(self) -> bool:
        """True when the model has an absolute position table (learned, built sinusoidal, or beside a relative
        mechanism: MPNet): P = E_P E_P^T exists."""
        return _has_table(self.family, self.config)

    def score_mode(self, inputs: LayerInputs | None = None) -> str:
        """The mode results report: 'paper' / 'faithful' for absolute tables, 'content-free' otherwise, and
        'data-conditioned' for scores of layer inputs from text (`inputs`)."""
        if inputs is not None:
            return DATA_CONDITIONED
        return self.mode if self.kind in T.TABLE_KINDS else CONTENT_FREE

    def require_table(self) -> None:
        """Refuse a model without an absolute position table, naming the commands that show its structure."""
        check_analysable(self.source, table=True)

    def causal(self, stack: str = "encoder") -> bool:
        """True when the model only lets query i see keys j <= i (k <= 0) in `stack`."""
        return T.is_causal(self.family, self.config) or (self.family.encoder_decoder and stack == "decoder")

    def switched_on(self, what: str) -> bool:
        """True when table field `what` applies to this checkpoint's config (`Family.switches`)."""
        return T.switched_on(self.family, self.config, what)

    def layer_kinds(self, n: int, stack: str = "encoder") -> list:
        """How each layer of `stack` attends over `n` positions (`posprobe.families.windows.LayerKind`)."""
        from posprobe.families.windows import layer_kinds

        key = ("layer_kinds", n, stack)
        if key not in self.cache:
            self.cache[key] = layer_kinds(self, n, stack)
            if self.family.indexer:  # sparse indexed layers: each query's top-k keys (families.indexed)
                from posprobe.families.indexed import indexed_kinds

                self.cache[key] = indexed_kinds(self, self.cache[key], n)
        return self.cache[key]

    @property
    def transformers_config(self):
        """The checkpoint's config as its transformers config class (rope parameters, layer types and properties
        normalised by it); built once."""
        if "transformers_config" not in self.cache:
            from posprobe.families.rotary import transformers_config

            self.cache["transformers_config"] = transformers_config(self)
        return self.cache["transformers_config"]

    def layers(self, stack: str = "encoder") -> int:
        """Number of attention layers of `stack`."""
        if stack == "decoder" and self.family.encoder_decoder:
            return int(self.config.get("num_decoder_layers") or self.shape.layers)
        return self.shape.layers

    def stored_layer(self, layer: int) -> int:
        """The stored layer whose weights depth `layer` uses (0 at every depth of ALBERT; the first depth that runs
        the same shared block in Zamba: `families.shared_blocks`)."""
        if "shared_blocks" in self.family.tensors:
            from posprobe.families.shared_blocks import stored_block_layer

            return stored_block_layer(self, layer)
        if "loop" in self.family.tensors:  # a block of layers run several times (Inkling 2 Loop)
            from posprobe.families.loops import loop_depth

            return loop_depth(self, layer)[0]
        return 0 if self.family.shared_layers else layer

    @property
    def max_positions(self) -> int | None:
        """Positions an analysis can use: the rows of an absolute table (reserved ones dropped), else the config's
        maximum less any reserved rows of a table beside the mechanism (MPNet); None when there is no limit."""
        if self.kind in T.TABLE_KINDS:
            return self.position_table.n_positions
        maximum = self.shape.max_positions
        if maximum and self.family.reserved_rows and self.family.position:
            maximum -= reserved_rows(self.config, self.source.name)
        return maximum

    # -- tensors ------------------------------------------------------------------------------------
    def key(self, pattern: str, layer: int | None = None, stack: str = "encoder") -> str | None:
        """The stored name ending in `pattern` (with `{l}` / `{stack}` filled in; of groups of alternatives
        'a.(b|c).(d|e)' the first combination the checkpoint holds), or None."""
        pieces = _ALTERNATIVES.split(pattern.format(**self._layer_names(layer), stack=stack))  # text, group, text, ...
        choices = [piece.split("|") if index % 2 else [piece] for index, piece in enumerate(pieces)]
        options = ("".join(parts) for parts in itertools.product(*choices))
        return next((k for k in map(self.reader.find_suffix, options) if k is not None), None)

    def _layer_names(self, layer: int | None) -> dict:
        """What `{l}` (and `{s}`, the attention sublayer: `Family.sublayers`; `{m}`, the stack a cycle runs:
        `Family.cycles`; the module of the depth's stack where stacks run one after another: `Family.stacks`) stand for
        at depth `layer`."""
        if self.family.stacks and layer is not None:  # BLT: encoder, global and decoder layers in turn
            module, _, stored = T.stack_depths(self.family, self.config)[layer]
            return {"l": stored, "m": module}
        if self.family.cycles and layer is not None:
            per_stack, low = (int(self.config[key]) for key in self.family.cycles)
            block, stored = divmod(layer, per_stack)
            return {"l": stored, "m": "L" if block % (low + 1) < low else "H"}
        k = self.family.sublayers
        return {"l": layer} if k == 1 or layer is None else {"l": layer // k, "s": layer % k}

    def tensor(self, pattern: str, layer: int | None = None, stack: str = "encoder") -> np.ndarray:
        """Tensor `pattern` (float64); a clear error when the checkpoint lacks it."""
        key = self.key(pattern, layer, stack)
        if key is None:
            suffix = pattern.format(**self._layer_names(layer), stack=stack)
            raise PosprobeError(
                f"checkpoint '{self.source.name}' has no tensor named '*{suffix}' for a {self.source.model_type} model",
                config_hint(self.source.name, "the weights do not match config.json; re-save the checkpoint"),
            )
        return self.reader.get(key)

    def optional(self, pattern: str, layer: int | None = None, stack: str = "encoder") -> np.ndarray | None:
        key = self.key(pattern, layer, stack)
        return None if key is None else self.reader.get(key)

    def norm(self, x: np.ndarray, prefix: str, layer: int | None = None, stack: str = "encoder") -> np.ndarray:
        """The family's norm with weights `prefix`.weight (and `.bias` when stored) applied to `x` (..., d)."""
        if self.family.norm in (T.PLAIN_LAYERNORM, T.PLAIN_RMSNORM, T.PLAIN_L2):  # no weights (OLMo, NanoChat, Dory)
            return apply_norm(x, self.family.norm, None, None, self.shape.eps)
        weight, bias = self.norm_weights(prefix, layer, stack)
        return apply_norm(x, T.norm_kind(self.family, self.config), weight, bias, self.shape.eps)

    def norm_weights(self, prefix: str, layer: int | None = None, stack: str = "encoder"):
        """(weight, bias or None) of norm `prefix`: `.weight` / `.bias`, or the older `.gamma` / `.beta` names (ESM
        and TensorFlow-converted checkpoints save them so)."""
        if self.key(prefix + ".weight", layer, stack) is None and self.key(prefix + ".gamma", layer, stack):
            return self.tensor(prefix + ".gamma", layer, stack), self.optional(prefix + ".beta", layer, stack)
        return self.tensor(prefix + ".weight", layer, stack), self.optional(prefix + ".bias", layer, stack)

    def linear(self, prefix: str, layer: int | None = None, stack: str = "encoder") -> tuple[np.ndarray, np.ndarray]:
        """A stored Linear `prefix` as (W (out, in), b (out,)); b is zeros where no bias is stored."""
        w = self.tensor(prefix + ".weight", layer, stack)
        b = self.optional(prefix + ".bias", layer, stack)
        return w, np.zeros(w.shape[0]) if b is None else b

    def attention(self, layer: int, stack: str = "encoder") -> HeadWeights:
        """Per-head Q/K weights of depth `layer` of `stack`, whatever the family's layout (`Family.qkv`, or the
        one a config switch picks: `table.qkv_layout`), acting on the layer input as `layer_input` gives it
        (a MobileBERT bottleneck, affine, is folded in)."""
        f, stored = self.family, self.stored_layer(layer)
        s = self.layer_shape(stored)
        if self.qkv == T.HEAD_TENSOR:  # parameters (d, H, d_h) themselves, no bias (XLNet)
            return _head_tensors(self, stored, stack)
        layout = self.stored_layout(stored, stack)
        w = self._projection(f.query, "q", stored, stack)
        b = self.optional(f.query + ".bias", stored, stack)
        try:
            if layout == T.GATED_QUERY:  # per head [q_h; gate_h] rows: keep the query's
                w = w.reshape(s.heads, 2, s.head_dim, -1)[:, 0].reshape(s.heads * s.head_dim, -1)
                b = None if b is None else b.reshape(s.heads, 2, s.head_dim)[:, 0].reshape(-1)
            if layout in (T.SEPARATE, T.GROUPED_CONV, T.GATED_QUERY, T.CCA):
                keys = key_source(self, stored)  # a layer that reuses keys (Gemma 3n): its source layer's projection
                wk = self._projection(f.key, "k", keys, stack)
                bk = self.optional(f.key + ".bias", keys, stack)
                if "query_adapter" in f.tensors:  # Zamba2's per-depth low-rank adapters: W + B A
                    from posprobe.families.shared_blocks import adapter_weight

                    w = w + adapter_weight(self, "query", layer, w.shape)
                    wk = wk + adapter_weight(self, "key", layer, wk.shape)
                if layout == T.GROUPED_CONV:
                    w, wk = grouped_conv_dense(w, self.attention_width), grouped_conv_dense(wk, self.attention_width)
                kv_heads = self.kv_heads(layer, stack)
                q, k = head_split(w, b, s.heads, s.head_dim), head_split(wk, bk, kv_heads, s.head_dim)
            else:
                q, k = split_fused(layout, w, b, s.heads, s.kv_heads, s.head_dim, f.qkv_blocks)
        except ValueError:  # a reshape that does not fit
            q = k = None
        width = q[0].shape[1] if q is not None else None
        if q is None or k[0].shape[1] != width or width != self.attention_width:
            raise PosprobeError(
                f"query/key weights of '{self.source.name}' layer {layer} do not match "
                f"{config_where(self.source.name).split(' of ')[0]} ({s.heads} heads of size {s.head_dim}, "
                f"{s.kv_heads} key heads)",
                config_hint(self.source.name, MIXED_HINT),
            )
        if "q_bias" in f.tensors:  # a query bias stored apart from the projection (DeBERTa v1)
            q = q[0], self.tensor(f.tensors["q_bias"], stored, stack).reshape(s.heads, s.head_dim)
        weights = HeadWeights(q[0], q[1], k[0], k[1], stored)
        prefix = self.bottleneck_prefix
        return weights if prefix is None else _fold(weights, *self.bottleneck(prefix, stored, stack))

    def stored_layout(self, layer: int, stack: str = "encoder") -> str:
        """The Q/K layout of stored layer `layer` as the checkpoint holds it: the family's (`qkv`), except where a
        fused layout's query and key names find two tensors: a model transformers loaded from a fused checkpoint
        (GTE, Nomic BERT, Sarvam-MoE: split on load) holds its own separate Q and K."""
        f = self.family
        if self.qkv not in (T.GPT2_CONV1D, T.PER_HEAD, T.STACKED, T.KV_GROUPED, T.BLOCKED):  # not fused
            return self.qkv
        fused = self.key(f.query + ".weight", layer, stack) == self.key(f.key + ".weight", layer, stack)
        return self.qkv if fused else T.SEPARATE

    def layer_shape(self, layer: int) -> Shape:
        """The sizes of stored layer `layer`: the config's, with the layer's own head size and key-head count where
        the config sets them per layer (`tensors['per_layer_heads']`: transformers' per_layer_config, Gemma 4's
        global layers; `tensors['latent_sizes']`: an MLA's heads and head size per layer, Dots3)."""
        name = self.family.tensors.get("per_layer_heads")
        if self.family.tensors.get("latent_sizes"):  # MLA sizes per layer (Dots3): every head its own key
            from posprobe.families.latent import layer_sizes

            own = layer_sizes(self, layer)
            return replace(self.shape, heads=own.heads, kv_heads=own.heads, head_dim=own.rope + own.nope)
        if self.family.tensors.get("query_heads_per_layer"):  # Laguna: the layer's own query-head count
            counts = query_heads_per_layer(self.config, self.source.name, self.family, self.shape.kv_heads)
            return self.shape if counts is None else replace(self.shape, heads=counts[layer])
        if not name:
            return self.shape
        own = getattr(self.transformers_config, name)[layer]
        return replace(self.shape, head_dim=int(own.head_dim), kv_heads=int(own.num_key_value_heads))

    def kv_heads(self, layer: int, stack: str = "encoder") -> int:
        """Key heads of layer `layer`: its shape's (`layer_shape`), times `Family.tensors['sliding_kv_factor']` in the
        family's sliding-window layers (MiMo-V2-Flash: twice as many there)."""
        factor = int(self.family.tensors.get("sliding_kv_factor", 1))
        sliding = factor > 1 and self.layer_kinds(1, stack)[layer].layer_type == "sliding_attention"
        return self.layer_shape(self.stored_layer(layer)).kv_heads * (factor if sliding else 1)

    def _projection(self, prefix: str, part: str, layer: int, stack: str) -> np.ndarray:
        """The weight of Linear `prefix`; where the files fuse it with others (`Family.tensors['fused_on_disk']`,
        equal row blocks in the order of `tensors['fused_parts']`, split by transformers on load: HRM's
        gqkv_proj), its block `part` of the fused weight."""
        names = self.family.tensors
        if "fused_on_disk" in names and self.key(prefix + ".weight", layer, stack) is None:
            parts = names["fused_parts"].split(",")
            fused = self.tensor(names["fused_on_disk"], layer, stack)
            return np.split(fused, len(parts), axis=0)[parts.index(part)]
        return self.tensor(prefix + ".weight", layer, stack)

    @property
    def attention_width(self) -> int:
        """The width the Q/K projections read: the hidden size, or MobileBERT's bottleneck width."""
        return config_size(self.config, self.source.name, "attention_width", default=self.shape.hidden)

    @cached_property
    def bottleneck_prefix(self) -> str | None:
        """The prefix of the bottleneck (Linear `.dense`, norm `.LayerNorm`) the layer input goes through before
        Q/K (`Family.bottleneck`: the first alternative whose config switches are all on), or None."""
        for keys, prefix in self.family.bottleneck:
            if all(T.config_flag(self.config, key) for key in keys):
                return prefix
        return None

    def bottleneck(self, prefix: str, layer: int, stack: str) -> tuple[np.ndarray, np.ndarray]:
        """The bottleneck as one affine map x -> x @ A + c (A (d, d'), c (d',)): its Linear then its NoNorm."""
        w, b = self.linear(prefix + ".dense", layer, stack)
        nw, nb = self.norm_weights(prefix + ".LayerNorm", layer, stack)
        return w.T * nw, b * nw + (0 if nb is None else nb)

    def layer_input(self, x: np.ndarray, layer: int, stack: str = "encoder") -> np.ndarray:
        """Embedding-level rows x (..., d) as layer `layer`'s attention projections see them: after the layer's
        pre-attention norm where it has one (SPEC §9: layer l's weights act on the embedding-level input)."""
        f = self.family
        if "hyper_connection" in f.tensors:  # HY-V4: the layer's hyper-connection mixes its streams before the norm
            x = x * _hyper_connection_weight(self, self.stored_layer(layer), x, stack)
        if "stream_mix" in f.tensors:  # Qwen4-Exp: a gated mix of its streams, each holding x (families.stream_mix)
            from posprobe.families.stream_mix import gated_stream_mix

            x = gated_stream_mix(self, self.stored_layer(layer), x, stack)
        if "altup" in f.tensors:  # Gemma 3n: the layer's AltUp prediction of its active stream (families.altup)
            x = altup_input(self, x, self.stored_layer(layer), stack)
        if "input_mix" in f.tensors:  # NeoMME: lambda_0 h + lambda_1 x_0, both the embedding-level input here
            x = x * self.tensor(f.tensors["input_mix"], self.stored_layer(layer), stack).sum()
        if f.pre_norm and layer >= f.pre_norm_from and self.switched_on("pre_norm"):
            x = self.norm(x, f.pre_norm, self.stored_layer(layer), stack)
        if "pre_norm_gate_down" in f.tensors:  # AXK2's gated norm: y * sigmoid(up(silu(down y)))
            x = x * _norm_gate(self, self.stored_layer(layer), x, stack)
        if "attention_in_multiplier" in f.tensors:  # Falcon-H1's muP factor on the attention branch's input
            x = x * float(self.config.get(f.tensors["attention_in_multiplier"], 1.0))
        return x

    # -- data-conditioned inputs (SPEC §13) ---------------------------------------------------------
    def layer_inputs(self, inputs: Mapping[int, np.ndarray]) -> LayerInputs:
        """`inputs` ({depth l: x_l (d,) or (n, d)}, see `LayerInputs`) as the frozen value the score functions take,
        checked against this model's width d. Everything after the input (the layer's norm, projections, biases,
        q/k norms, positional mechanism, scaling, soft cap) is unchanged: every score module reads its input
        through `layer_rows` / `query_key`. An absolute position table then enters only through x_l (the model
        added it before layer 0)."""
        value = LayerInputs(inputs)
        if any(x.shape[-1] != self.shape.hidden for x in value.rows.values()):
            raise ValueError(f"layer inputs must be (d,) or (n, d) with d = {self.shape.hidden}")
        return value

    def layer_rows(
        self, layer: int, stack: str = "encoder", positions: np.ndarray | None = None, inputs: LayerInputs | None = None
    ) -> np.ndarray:
        """Rows (m, d) that layer `layer`'s attention projections see, after its pre-attention norm: m = 1 for an
        input that is the same at every position, m = n for one row per position. By default the embedding-level
        input of the average word (plus `positions` (n, e) table rows where given: SPEC §3, §9); with
        data-conditioned `inputs` the hidden state entering the layer, `positions` ignored (the model already
        added its table before layer 0)."""
        if inputs is not None and "altup" in self.family.tensors:
            raise PosprobeError(
                f"'{self.source.name}' ({self.source.model_type}) feeds each layer a stack of AltUp streams, not "
                "one hidden state: its scores cannot be conditioned on text",
                "drop --text (texts=) for its content-free scores (SPEC §9)",
            )
        x = self.embedding_rows(positions) if inputs is None else inputs.at(layer)
        if "concatenated_input" in self.family.tensors:  # Zamba: the block reads [hidden; embeddings]
            from posprobe.families.shared_blocks import concatenated

            if inputs is not None:
                raise PosprobeError(
                    f"'{self.source.name}' ({self.source.model_type}) attends over [hidden state; embeddings] of each "
                    "token, and data-conditioned inputs give the hidden state alone",
                    "use the content-free scores (`posprobe fhat` / `profiles` without --text)",
                )
            x = concatenated(x, x)
        return self.layer_input(x, layer, stack)

    def word_input(self, layer: int, stack: str = "encoder", inputs: LayerInputs | None = None) -> np.ndarray:
        """What layer `layer`'s attention projections see at every position (d,) — the average word, or a
        data-conditioned mean — or, for a per-position input, at each position (n, d)."""
        rows = self.layer_rows(layer, stack, inputs=inputs)
        per_position = inputs is not None and inputs.per_position
        return rows[0] if rows.shape[0] == 1 and not per_position else rows

    def query_key(
        self, layer: int, stack: str = "encoder", inputs: LayerInputs | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Query (H, d_h) and key (H_kv, d_h) of the input at `layer` (`word_input`), biases, clamps and q/k norms
        applied (unless the family norms the rotated q and k: `qk_norm_after_rotary`), before any positional
        mechanism; (H, n, d_h) and (H_kv, n, d_h) for a per-position input. A layer that reuses an earlier
        layer's keys (`kv_sharing.key_source`) gets that layer's keys of that layer's own input; keys a layer's
        softmax reads rounded (`sink_local.rounded_keys`) are so rounded."""
        q, k = self._query_key(layer, stack, inputs)
        source = key_source(self, layer)
        if source != layer:
            if inputs is not None and source not in inputs.rows:
                raise PosprobeError(
                    f"layer {layer} of '{self.source.name}' attends to the keys layer {source} computes: its scores "
                    f"need layer {source}'s input too",
                    f"give the hidden states entering layer {source} as well",
                )
            k = self._query_key(source, stack, inputs)[1]
        if "key_rounding" in self.family.tensors:  # Kolibri 1.1: its indexed layers attend NVFP4 keys
            from posprobe.families.sink_local import rounded_keys

            k = rounded_keys(self, layer, k)
        return q, k

    def _query_key(
        self, layer: int, stack: str = "encoder", inputs: LayerInputs | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        x = self.word_input(layer, stack, inputs)
        if self.qkv in (T.LATENT, T.ROUTED_QUERY):  # MLA (families.latent), routed query experts (families.routed)
            from posprobe.families.latent import latent_query_key
            from posprobe.families.routed import routed_query_key

            read = latent_query_key if self.qkv == T.LATENT else routed_query_key
            q, k = read(self, np.atleast_2d(x), self.stored_layer(layer))
            return (q[:, 0], k[:, 0]) if x.ndim == 1 else (q, k)
        if self.qkv == T.SHARED_KV:  # DeepSeek V4: a query LoRA, one shared key-value head (families.shared_kv)
            from posprobe.families.shared_kv import shared_kv_query_key

            q, k = shared_kv_query_key(self, np.atleast_2d(x), self.stored_layer(layer))
            return (q[:, 0], k[:, 0]) if x.ndim == 1 else (q, k)
        if self.qkv == T.CCA:  # ZAYA: q and k mixed along the sequence, then normed (families.convolutional)
            from posprobe.families.convolutional import cca_query_key

            q, k = cca_query_key(self, np.atleast_2d(x), self.stored_layer(layer))
            return (q[:, 0], k[:, 0]) if x.ndim == 1 else (q, k)
        weights = self.attention(layer, stack)
        q, k = weights.queries(x), weights.keys(x)
        clip = T.config_get(self.config, self.family.clip) if self.family.clip else None
        if clip is not None:  # OLMo's clip_qkv
            q, k = np.clip(q, -clip, clip), np.clip(k, -clip, clip)
        if "key_multiplier" in self.family.tensors:  # Falcon-H1's muP factor on the keys
            k = k * float(self.config.get(self.family.tensors["key_multiplier"], 1.0))
        if self.family.qk_norm_after_rotary:  # Hunyuan: the rotary score module applies them to rotated q and k
            return q, k
        return self.qk_norm(q, k, layer, stack)

    def query_key_of(
        self, hidden: np.ndarray, layer: int, stack: str = "encoder", key_hidden: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Queries (H, T, d_h) and keys (H_kv, T, d_h) of hidden states `hidden` (T, d) entering layer `layer`
        (transformers' `hidden_states[layer]`: real tokens of real text), before any positional mechanism:
        `query_key`'s own path (the layer's norm, projections, biases, q/k norms) with those rows as the input.
        `key_hidden`: the hidden states (T, d) entering the layer whose keys `layer` reuses (Gemma 4), where
        `kv_sharing.key_source` names another."""
        if {"hyper_connection", "stream_mix"} & set(self.family.tensors):  # HY-V4, Qwen4-Exp: N streams per layer
            raise PosprobeError(
                f"'{self.source.name}' ({self.source.model_type}) passes several hyper-connection streams between "
                "layers; posprobe reads its layer inputs only where every stream holds the same vector (SPEC §9)",
                "use the content-free reading (no --text)",
            )
        rows = {layer: np.atleast_2d(np.asarray(hidden, dtype=np.float64))}
        if key_hidden is not None:
            rows[key_source(self, layer)] = np.atleast_2d(np.asarray(key_hidden, dtype=np.float64))
        inputs = LayerInputs(rows)
        q, k = self.query_key(layer, stack, inputs)
        return (q, k) if q.ndim == 3 else (q[:, None], k[:, None])

    def qk_norm(self, q: np.ndarray, k: np.ndarray, layer: int, stack: str = "encoder"):
        """The family's q/k norms where the checkpoint has them (Qwen3, Phi with qk_layernorm, Cohere, StableLM,
        Persimmon, OLMo-2): q (H, ..., d_h), k (H_kv, ..., d_h) normalised per head over d_h (one weight for all
        heads, or one per head), or over the whole projection (`Family.qk_norm_scope` 'all')."""
        f, stored = self.family, self.stored_layer(layer)
        if not f.qk_norm or not self.switched_on("qk_norm"):
            return q, k
        if f.norm in (T.PLAIN_LAYERNORM, T.PLAIN_RMSNORM):  # weightless q/k norms (NeoMME)
            return apply_norm(q, f.norm, None, None, self.shape.eps), apply_norm(k, f.norm, None, None, self.shape.eps)
        first = f.qk_norm[0].replace("{h}", "0")
        if not (self.key(first + ".weight", stored, stack) or self.key(first + ".gamma", stored, stack)):
            return q, k
        keys = key_source(self, stored)  # a layer that reuses keys (Gemma 3n) has its source layer's key norm
        return self._qk_normed(q, f.qk_norm[0], stored, stack), self._qk_normed(k, f.qk_norm[1], keys, stack)

    def _qk_normed(self, x: np.ndarray, prefix: str, layer: int, stack: str) -> np.ndarray:
        heads = x.shape[0]
        if "{h}" in prefix:  # one norm module per head
            parts = [self._weights(prefix.replace("{h}", str(h)), layer, stack) for h in range(heads)]
            weight = np.stack([w for w, _ in parts])
            bias = None if parts[0][1] is None else np.stack([b for _, b in parts])
        else:
            weight, bias = self._weights(prefix, layer, stack)
        if self.family.qk_norm_scope == "all":  # over every head's features at once, before the head split
            flat = np.moveaxis(x, 0, -2).reshape(*x.shape[1:-1], heads * x.shape[-1])
            out = apply_norm(flat, T.norm_kind(self.family, self.config), weight, bias, self.shape.eps)
            return np.moveaxis(out.reshape(*x.shape[1:-1], heads, x.shape[-1]), -2, 0)
        shape = (heads,) + (1,) * (x.ndim - 2) + (x.shape[-1],)
        weight = weight.reshape(shape) if weight.ndim == 2 else weight
        bias = bias.reshape(shape) if bias is not None and bias.ndim == 2 else bias
        return apply_norm(x, T.norm_kind(self.family, self.config), weight, bias, self.shape.eps)

    def _weights(self, prefix: str, layer: int, stack: str) -> tuple[np.ndarray, np.ndarray | None]:
        return self.norm_weights(prefix, layer, stack)

    # -- how scores are formed ----------------------------------------------------------------------
    @property
    def scaling(self) -> float:
        """The factor q.k is multiplied by before softmax (`Family.scaling`): 1 / sqrt(d_h), 1 ('none'),
        config[KEY] ** -0.5 ('rsqrt:KEY': Gemma 2's query_pre_attn_scalar), config[KEY] ('value:KEY': Granite's
        attention_multiplier), d_h ** -0.5 or 1 by a config switch ('head_dim_if:KEY'), or DeBERTa's
        1 / sqrt(d_h * (1 + position terms)) rounded to float32."""
        how = self.family.scaling
        if how == "none":
            return 1.0
        if how == "head_dim":
            return self.shape.head_dim**-0.5
        if how == "half_head_dim":  # Zamba: (d_h / 2) ** -0.5
            return (self.shape.head_dim / 2) ** -0.5
        if how == "disentangled":
            return 1.0 / disentangled_scale(self.config, self.shape.head_dim, self.family)
        if how == "latent":
            from posprobe.families.latent import latent_scaling

            return latent_scaling(self)
        rule, key = how.split(":")
        if rule == "head_dim_if":  # GPT-BigCode: scale_attn_weights
            return self.shape.head_dim**-0.5 if T.config_flag(self.config, key) else 1.0
        value = self.config.get(key)
        value = value if value is not None else config_default(self.config, (key,))
        if value is None:
            raise PosprobeError(
                f"config.json of '{self.source.name}' lacks '{key}', which sets its attention scale",
                "re-save the checkpoint with `save_pretrained` (it writes every field)",
            )
        return float(value) ** -0.5 if rule == "rsqrt" else float(value)

    def layer_scaling(self, layer: int) -> float:
        """`scaling` at depth `layer`: the same at every depth, except an MLA whose head sizes are set per layer
        (`families.latent.layer_sizes`: Dots3's sliding layers), and the layers other than sliding ones of a family
        whose config scales their logits (`Family.tensors['global_scale']`: Ergo's global_attention_scale)."""
        if self.family.scaling == "latent":
            from posprobe.families.latent import latent_scaling

            return latent_scaling(self, self.stored_layer(layer))
        return self.scaling * self._global_scale(layer)

    def _global_scale(self, layer: int) -> float:
        """The factor s of config[tensors['global_scale']] on a layer that is not a sliding one (or on every layer
        where no window is set), 1 elsewhere or where the config sets none. Ergo multiplies q and k each by
        sqrt(s), held as a float32 buffer: s is that root, rounded to float32, squared."""
        key = self.family.tensors.get("global_scale")
        value = self.config.get(key) if key else None
        if value is None:
            return 1.0
        cfg = self.transformers_config
        types = list(getattr(cfg, "layer_types", None) or [])
        if getattr(cfg, "sliding_window", None) is not None and layer < len(types):
            if types[layer] == "sliding_attention":
                return 1.0
        return float(np.float32(float(value) ** 0.5)) ** 2

    def softcap(self, scores: np.ndarray) -> np.ndarray:
        """The family's logit soft cap `cap * tanh(scores / cap)` where its config sets one; else `scores`."""
        cap = self.config.get(self.family.softcap) if self.family.softcap else None
        return scores if cap is None else cap * np.tanh(scores / cap)


def pos_att_types(config: dict) -> list[str]:
    """DeBERTa's `pos_att_type` as its module reads it: a list ('c2p|p2c' split), [] when absent."""
    kinds = config.get("pos_att_type") or []
    return [x.strip() for x in kinds.lower().split("|")] if isinstance(kinds, str) else kinds


def disentangled_scale(config: dict, head_dim: int, family: T.Family) -> float:
    """DeBERTa's score divisor sqrt(d_h * (1 + terms)), rounded to float32 as its module does: v2/v3 count c2p
    and p2c, v1 (`tensors['scale_terms']`) every listed term."""
    import torch

    kinds = pos_att_types(config)
    terms = len(kinds) if "scale_terms" in family.tensors else ("c2p" in kinds) + ("p2c" in kinds)
    return float(torch.sqrt(torch.tensor(head_dim, dtype=torch.float32) * (1 + terms)))


def _norm_gate(ctx: ModelContext, layer: int, y: np.ndarray, stack: str) -> np.ndarray:
    """sigmoid(up(silu(down y))) of a gated norm's low-rank gate (Linears without biases, named by the family's
    `tensors['pre_norm_gate_down']` and `['pre_norm_gate_up']`), for normed rows y (..., d)."""
    names = ctx.family.tensors
    hidden = y @ ctx.tensor(names["pre_norm_gate_down"] + ".weight", layer, stack).T
    gate = (hidden / (1.0 + np.exp(-hidden))) @ ctx.tensor(names["pre_norm_gate_up"] + ".weight", layer, stack).T
    return 1.0 / (1.0 + np.exp(-gate))


def _hyper_connection_weight(ctx: ModelContext, layer: int, x: np.ndarray, stack: str) -> np.ndarray:
    """(..., 1) the sum of a hyper-connection's pre-mix weights for rows x (..., d) held in every one of its N
    streams (the embedding-level input: the model copies the embedding into each stream), so that the mix it hands
    the layer is that sum times x. Its module (`tensors['hyper_connection']` + fn (2N, N d), base (2N,), scale (2,))
    gives stream s the weight sigmoid(scale_0 (fn_s . [x; ...; x]) / rms([x; ...; x]) + base_s) + eps."""
    prefix = ctx.family.tensors["hyper_connection"]
    fn = ctx.tensor(prefix + "fn", layer, stack)
    streams = fn.shape[1] // x.shape[-1]
    flat = np.concatenate([x] * streams, -1)
    mixes = flat @ fn[:streams].T / np.sqrt((flat**2).mean(-1, keepdims=True) + ctx.shape.eps)  # (..., N)
    scale, base = ctx.tensor(prefix + "scale", layer, stack)[0], ctx.tensor(prefix + "base", layer, stack)[:streams]
    eps = float(ctx.config.get(ctx.family.tensors["hyper_connection_eps"], 0.0))
    return (1.0 / (1.0 + np.exp(-(mixes * scale + base))) + eps).sum(-1, keepdims=True)


def _head_tensors(ctx: ModelContext, stored: int, stack: str) -> HeadWeights:
    """Q/K weights stored as parameters (d, H, d_h) (`table.HEAD_TENSOR`: q_h = x @ W[:, h], no bias)."""
    s = ctx.shape
    wq, wk = (ctx.tensor(name, stored, stack) for name in (ctx.family.query, ctx.family.key))
    if wq.shape != (ctx.attention_width, s.heads, s.head_dim) or wk.shape != (ctx.attention_width, s.kv_heads,
                                                                              s.head_dim):  # fmt: skip
        raise PosprobeError(
            f"query/key weights of '{ctx.source.name}' layer {stored} do not match "
            f"{config_where(ctx.source.name).split(' of ')[0]} ({s.heads} heads of size {s.head_dim})",
            config_hint(ctx.source.name, MIXED_HINT),
        )
    wq, wk = wq.transpose(1, 0, 2), wk.transpose(1, 0, 2)
    return HeadWeights(wq, np.zeros(wq.shape[::2]), wk, np.zeros(wk.shape[::2]), stored)


def require_hidden_layer_inputs(ctx: ModelContext) -> None:
    """Refuse to take transformers' `hidden_states[l]` as the input of attention layer l where it is not: a family
    with several attention sublayers per layer (`Family.sublayers`, LongCat-Flash) has hidden states only where its
    layers begin, not before each sublayer; one whose layers mix in the embedding output (NeoMME's lambdas) or whose
    stacks run in cycles (HRM: one stack's state added to the other's input) reads more than the hidden state; one
    whose q and k are mixed along the sequence (ZAYA) needs the sequence, not a mean; one whose stacks run over bytes
    and over patches (BLT) has no one hidden state per layer over the text's positions."""
    if "input_mix" in ctx.family.tensors:
        raise PosprobeError(
            f"'{ctx.source.name}' ({ctx.source.model_type}) mixes each layer's input with the embedding output "
            "(lambdas), which transformers' hidden states do not hold, so its layers cannot read inputs from text",
            "drop --text (texts=) for its content-free scores (SPEC §9)",
        )
    if ctx.qkv == T.CCA:
        raise PosprobeError(
            f"'{ctx.source.name}' ({ctx.source.model_type}) mixes its queries and keys along the sequence "
            "(convolutions), so a mean of hidden states from text does not give them",
            "drop --text (texts=) for its content-free scores (SPEC §9)",
        )
    if ctx.family.stacks:  # BLT: byte stacks around a stack over patches
        raise PosprobeError(
            f"'{ctx.source.name}' ({ctx.source.model_type}) runs stacks over its bytes and over patches of them, whose "
            "hidden states are not one per layer over the text's positions, so its layers cannot read inputs from text",
            "drop --text (texts=) for its content-free scores (SPEC §9)",
        )
    if ctx.family.cycles:
        raise PosprobeError(
            f"'{ctx.source.name}' ({ctx.source.model_type}) runs its stacks in cycles, adding one stack's state to the "
            "other's input between them, which transformers' hidden states do not hold, so its layers cannot read "
            "inputs from text",
            "drop --text (texts=) for its content-free scores (SPEC §9)",
        )
    if ctx.family.sublayers > 1:
        raise PosprobeError(
            f"'{ctx.source.name}' ({ctx.source.model_type}) has {ctx.family.sublayers} attention sublayers per layer: "
            "transformers' hidden states enter its layers, not each sublayer, so these layers cannot read inputs from "
            "text",
            "drop --text (texts=) for its content-free scores (SPEC §9)",
        )


def _fold(weights: HeadWeights, a: np.ndarray, c: np.ndarray) -> HeadWeights:
    """Q/K weights applied after an affine map x -> x @ a + c, as weights on x itself (exact)."""
    wq, wk = np.einsum("de,hef->hdf", a, weights.wq), np.einsum("de,hef->hdf", a, weights.wk)
    bq, bk = weights.bq + np.einsum("e,hef->hf", c, weights.wq), weights.bk + np.einsum("e,hef->hf", c, weights.wk)
    return HeadWeights(wq, bq, wk, bk, weights.stored_layer)


_ALTERNATIVES = re.compile(r"\(([^()|]+(?:\|[^()|]+)+)\)")


CONTENT_FREE = "content-free"  # the mode of families without an absolute table (SPEC §9)
DATA_CONDITIONED = "data-conditioned"  # the mode of scores of layer inputs from real text (SPEC §13)


def head_products(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """q . k of every query head with the key head it reads (grouped-query attention: query head h reads key head
    h // (H / H_kv)): (H, 1, 1) for one query and key per head, q (H, d_h) and k (H_kv, d_h); (H, n, n) (row i =
    query position, column j = key position) for one per position, q (H, n, d_h) and k (H_kv, n, d_h)."""
    k = np.repeat(k, q.shape[0] // k.shape[0], axis=0)
    if q.ndim == 2:
        return (q * k).sum(-1)[:, None, None]
    return q @ k.transpose(0, 2, 1)


def _has_table(family: T.Family, config: dict) -> bool:
    return T.position_kind(config)[0] in T.TABLE_KINDS or T.has_learned_table(config)


def check_analysable(source: ModelSource, table: bool = False) -> T.Family:
    """The family-table entry of `source` when posprobe computes its positional scores (`table`: and it has an
    absolute position table, P = E_P E_P^T); else one clear error naming what the family uses instead. The one
    gatekeeper of what is analysable: cheap (config only), so callers run it before reading any weights."""
    family = _analysable_family(source)
    if table and not _has_table(family, source.config):
        raise PosprobeError(
            f"'{source.name}' ({source.model_type}) has no learned position table (it uses "
            f"{family.mechanism}), so there is no P = E_P E_P^T",
            "its positional structure is shown by `posprobe profiles` (per-head scores over k = j - i) and "
            "`posprobe fhat`",
        )
    return family


def _analysable_family(source: ModelSource) -> T.Family:
    model_type, cfg = source.model_type, source.config
    family = T.family_for_type(model_type)
    if family is None:  # an in-memory model (a resolved checkpoint of such a type was refused already)
        raise unlisted_type_error(source.name, model_type)
    if not family.softmax_attention:
        raise PosprobeError(
            f"'{source.name}' ({model_type}) has {family.mechanism}, so there are no attention scores or positional "
            "terms for posprobe to analyse",
            "posprobe reads models with softmax attention in at least one layer (docs/families.md)",
        )
    if family.draft_of:
        raise PosprobeError(
            f"'{source.name}' ({model_type}) is {family.mechanism}",
            "a draft model is read through the model it drafts for (the table of families: docs/families.md)",
        )
    kind, mechanism = T.position_kind(cfg)
    table = kind in T.TABLE_KINDS and any(k in T.TABLE_KINDS for k in family.kinds)
    scores = kind in family.kinds and kind in SCORE_MODULES
    if family.analysable and (table or scores):
        return family
    raise PosprobeError(
        f"'{source.name}' ({model_type}) uses {mechanism}; posprobe does not read this model yet",
        f"docs/families.md lists the families posprobe reads ({', '.join(T.model_types(analysable=True))})",
    )


def content_free_scores(
    ctx: ModelContext, layer: int, n: int, stack: str = "encoder", inputs: LayerInputs | None = None
) -> np.ndarray:
    """F_hat (H, n, n) of SPEC §3 / §9 for `layer` of `stack`: dispatched to the score module of the model's kind
    (SPEC §13 for data-conditioned layer `inputs`; a per-position input must have exactly n rows). A hybrid's layer
    without softmax attention (Mamba, convolution) has no positional score: all NaN."""
    if inputs is not None and inputs.per_position and np.shape(inputs.rows.get(layer))[0] != n:
        raise ValueError(f"the per-position input of layer {layer} does not have {n} rows")
    if inputs is not None and ctx.family.indexer:  # its mask is the indexer's pick on the content-free input
        raise PosprobeError(
            f"'{ctx.source.name}' ({ctx.source.model_type}) attends the keys its indexer picks from the layer input; "
            "posprobe reads that pick on the content-free input only, not on data-conditioned inputs",
            "use the content-free scores (no --text) or `posprobe attention` on the texts",
        )
    ctx = ctx.for_stack(stack)  # a decoder read through fields of its own (`Family.decoder_stack`)
    if ctx.family.hybrid and ctx.layer_kinds(n, stack)[layer].attention == "none":
        return np.full((ctx.shape.heads, n, n), np.nan)  # a recurrent / convolution layer: no positional score
    scores = importlib.import_module(SCORE_MODULES[ctx.kind]).content_free_scores(ctx, layer, n, stack, inputs)
    return absent_heads_as_nan(scores, ctx.shape.heads)


def absent_heads_as_nan(scores: np.ndarray, heads: int) -> np.ndarray:
    """A layer's scores (H_l, ...) on the model's head axis of H >= H_l heads (SPEC §9: a layer with fewer query
    heads than the model's most, Laguna): heads H_l .. H - 1 are NaN, no such head; unchanged where H_l = H."""
    if scores.shape[0] == heads:
        return scores
    missing = np.full((heads - scores.shape[0], *scores.shape[1:]), np.nan)
    return np.concatenate([scores, missing])


#: How a score matrix's input varies along the sequence: the same vector at every position (the average word
#: embedding e_w of SPEC §9, or one mean of real hidden states, SPEC §13 'mean'), or one per position (SPEC §13
#: 'position-mean').
SAME_INPUT = "same at every position"
PER_POSITION_INPUT = "per position"


def toeplitz_by_construction(
    ctx: ModelContext, stack: str = "encoder", input_mode: str = SAME_INPUT, conditioned: bool = False
) -> bool:
    """True when the score matrices of this model (position kind, config) for inputs of `input_mode` depend on
    k = j - i alone whatever the weights, so their Toeplitz R^2 is 1 by construction and measures nothing: decided
    by the score module of the model's kind, never by testing numbers. An input that differs along the sequence
    (`PER_POSITION_INPUT`) makes no matrix Toeplitz by construction; `conditioned`: the input is a data-conditioned
    hidden state (SPEC §13), which already holds any absolute table."""
    if input_mode not in (SAME_INPUT, PER_POSITION_INPUT):
        raise ValueError(f"input_mode must be {SAME_INPUT!r} or {PER_POSITION_INPUT!r}, got {input_mode!r}")
    if input_mode != SAME_INPUT:
        return False
    ctx = ctx.for_stack(stack)
    return bool(importlib.import_module(SCORE_MODULES[ctx.kind]).toeplitz_by_construction(ctx, stack, conditioned))
