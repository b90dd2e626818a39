"""The one model reader: `ModelContext` sees one checkpoint through its family entry and gives canonical tensors.

Everything that knows where a family keeps a tensor, how its Q/K are laid out, which norm it applies with which
epsilon, how it scales and caps scores, and whether posprobe can analyse it, lives here and in the family table
(`posprobe.families.table`). The score modules (`table.SCORE_MODULES`) read only through a context.

Shapes: d hidden width, e embedding width (e != d for factorised embeddings: ALBERT, ELECTRA-small), H query
heads, H_kv key/value heads (grouped-query attention: query head h reads key head h // (H / H_kv)), d_h head size,
n positions. Canonical per-head weights: q_h = x @ W_Q[h] + b_Q[h] with W_Q (H, d, d_h), b_Q (H, d_h).
"""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from posprobe.checkpoint.config import config_int
from posprobe.errors import PosprobeError
from posprobe.families import table as T
from posprobe.families.layouts import grouped_conv_dense, head_split, split_fused
from posprobe.families.table import config_default

if TYPE_CHECKING:
    from posprobe.checkpoint.resolve import ModelSource

STACKS = ("encoder", "decoder")
_CONFIG_HINT = "fix config.json or re-save the checkpoint with `save_pretrained`"
_MIXED_HINT = "the folder mixes files from two checkpoints; re-download it"


# ------------------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class Shape:
    """Sizes from config.json: `heads` H, `kv_heads` H_kv, `head_dim` d_h, `hidden` d, `layers` L, norm `eps`,
    `max_positions` (None when the family has no limit), `vocab` (None when the config does not say)."""

    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    layers: int
    eps: float
    max_positions: int | None
    vocab: int | None


def config_size(config: dict, name: str | None, what: str, default=None, required: bool = True) -> int | None:
    """Size `what` (a `table.CONFIG_KEYS` entry: 'heads', 'hidden', ...) under whatever name the config uses, a
    whole number >= 1; `default` (or None when not `required`) if absent. `name` names the checkpoint in errors."""
    where = f"config.json of '{name}'" if name else "the config"
    value = T.config_value(config, what)
    if value is None:
        if default is not None or not required:
            return default
        raise PosprobeError(f"{where} has no {what} field (looked for {', '.join(T.CONFIG_KEYS[what])})", _CONFIG_HINT)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        key = next(k for k in T.CONFIG_KEYS[what] if config.get(k) is not None)
        raise PosprobeError(f"{where} has {key} = {value!r}, expected a whole number >= 1", _CONFIG_HINT)
    return value


def config_shape(config: dict, name: str, family: T.Family) -> Shape:
    """Heads, widths, layers and the norm epsilon of `config` under whatever names its family uses: the one place
    a model's sizes are read and checked."""
    heads = config_size(config, name, "heads")
    hidden = config_size(config, name, "hidden")
    kv_heads = T.qkv_layout(family, config)[1] or config_size(config, name, "kv_heads", default=heads)
    width = config_size(config, name, "attention_width", default=hidden)  # MobileBERT's bottleneck width
    head_dim = config_size(config, name, "head_dim", default=width // heads)
    if T.config_value(config, "head_dim") is None and width % heads:
        raise PosprobeError(
            f"config.json of '{name}' has hidden size {width} not divisible by {heads} heads",
            "the config is malformed; re-save the checkpoint",
        )
    if heads % kv_heads:
        raise PosprobeError(
            f"config.json of '{name}' has {heads} query heads, not a multiple of {kv_heads} key/value heads",
            "the config is malformed; re-save the checkpoint",
        )
    eps = family.eps if family.eps is not None else T.config_value(config, "eps")  # the family's code decides first
    if eps is None:  # a hand-written config: its transformers config's default
        eps = config_default(config, T.CONFIG_KEYS["eps"])
        if eps is None:
            raise PosprobeError(
                f"config.json of '{name}' gives no norm epsilon (looked for {', '.join(T.CONFIG_KEYS['eps'])})",
                "add the model's layer_norm_eps / rms_norm_eps to config.json",
            )
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0 or not math.isfinite(eps):
        raise PosprobeError(
            f"config.json of '{name}' has a norm epsilon {eps!r}, expected a positive number", _CONFIG_HINT
        )
    positions = T.config_value(config, "positions")
    positions = config_size(config, name, "positions") if positions is not None else None
    vocab = config_size(config, name, "vocab") if T.config_value(config, "vocab") is not None else None
    layers = config_size(config, name, "layers")
    if family.shared_layers and config_int(config, name, "num_hidden_groups", default=1) != 1:
        raise PosprobeError(
            f"'{name}' is an ALBERT with {config.get('num_hidden_groups')} layer groups",
            "posprobe analyses ALBERT checkpoints with one shared layer group (all released ones)",
        )
    return Shape(heads, kv_heads, head_dim, hidden, layers, float(eps), positions, vocab)


def reserved_rows(config: dict, name: str) -> int:
    """Leading rows of the position table that no position uses: pad_token_id + 1 in the RoBERTa family (SPEC
    §1), the entry's fixed count for MPNet, 0 elsewhere. A RoBERTa-family config without a pad_token_id is
    refused (the model cannot number positions without it)."""
    family = T.family_for_type(str(config.get("model_type", "")))
    if family is None or not family.reserved_rows:
        return 0
    if family.reserved_rows is not True:  # a fixed count (MPNet)
        return int(family.reserved_rows)
    pad = config_int(config, name, "pad_token_id", default=1, minimum=0, nullable=True)
    if pad is None:
        raise PosprobeError(
            f"config.json of '{name}' has pad_token_id null, but a {config.get('model_type')} position table "
            "reserves pad_token_id + 1 leading rows",
            "set pad_token_id in config.json (1 for RoBERTa, XLM-R and CamemBERT)",
        )
    return pad + 1


def mixed_checkpoint(name: str, what: str, config_says, weights_hold) -> PosprobeError:
    """The error for a config.json that disagrees with the weights beside it."""
    return PosprobeError(f"config.json of '{name}' says {what} {config_says} but the weights hold {weights_hold}",
                         _MIXED_HINT)  # fmt: skip


# -------------------------------------------------------------------------------------------- norms
def apply_norm(x: np.ndarray, kind: str, weight, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """The norm `kind` (table.NORMS) over the last axis of `x`, as torch computes it (biased variance); `weight`
    None for a norm without weights (OLMo's)."""
    if kind == T.NONORM:
        out = x * weight
    elif kind in (T.LAYERNORM, T.PLAIN_LAYERNORM):
        mean = x.mean(axis=-1, keepdims=True)
        out = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
        out = out if weight is None else out * weight
    else:
        out = x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps)
        out = out * (1.0 + weight if kind == T.RMSNORM_PLUS1 else weight)
    return out if bias is None else out + bias


def embed_scale(hidden: int, dtype: str | None) -> float:
    """sqrt(d) rounded to the word table's dtype, as Gemma's scaled embedding multiplies by it."""
    import torch

    torch_dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}.get(dtype or "", torch.float64)
    return float(torch.tensor(hidden**0.5).to(torch_dtype).double())


# ------------------------------------------------------------------------------------ weight shapes
@dataclass(frozen=True)
class PositionTable:
    """An absolute position table `table` (n, e) (learned, or sinusoidal as the model builds it); `dropped_rows`
    reserved leading rows were removed (RoBERTa family, MPNet)."""

    model: str
    model_type: str
    table: np.ndarray
    dropped_rows: int

    @property
    def n_positions(self) -> int:
        return self.table.shape[0]


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


def _project(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.einsum("...d,hde->h...e", x, w)
    return out + b.reshape(b.shape[0], *([1] * (x.ndim - 1)), b.shape[1])


# ------------------------------------------------------------------------------------------ context
class ModelContext:
    """One checkpoint seen through its family entry: `source`, `reader` (a WeightReader, StateDictReader or any
    reader with `get`, `find_suffix`, `row_mean`, `shape`, `stored_dtype`: float64 numpy), `family`, `config`,
    `shape`, `kind` (its position kind, config switches included), `mode` ('paper' or 'faithful': how an
    absolute table's scores are formed, SPEC §3; the other kinds give SPEC §9's content-free scores).

    Creating one refuses, with one clear line, a model posprobe cannot analyse."""

    def __init__(self, source: ModelSource, reader, mode: str = "paper"):
        self.source, self.reader, self.mode = source, reader, mode
        self.family = check_analysable(source)
        self.kind = T.position_kind(source.config)[0]
        self.config = source.config
        self.shape = config_shape(self.config, source.name, self.family)
        self.qkv = T.qkv_layout(self.family, self.config)[0]
        self.cache: dict = {}  # what score functions compute once for every layer (e.g. rotary angles)

    # -- what the model is --------------------------------------------------------------------------
    @property
    def has_table(self) -> bool:
        """True when the model has an absolute position table (learned, built sinusoidal, or beside a relative
        mechanism: MPNet): P = E_P E_P^T exists."""
        return _has_table(self.family, self.config)

    @property
    def score_mode(self) -> str:
        """The mode results report: 'paper' / 'faithful' for absolute tables, 'content-free' otherwise."""
        return self.mode if self.kind in T.TABLE_KINDS else CONTENT_FREE

    def require_table(self) -> None:
        """Refuse a model without an absolute position table, naming the commands that show its structure."""
        check_analysable(self.source, table=True)

    def causal(self, stack: str = "encoder") -> bool:
        """True when the model only lets query i see keys j <= i (k <= 0) in `stack`."""
        f = self.family
        if f.causal and f.bidirectional and T.config_flag(self.config, f.bidirectional):
            return False
        return f.causal or (f.encoder_decoder and stack == "decoder")

    def switched_on(self, what: str) -> bool:
        """True when table field `what` applies to this checkpoint's config (`Family.switches`)."""
        return T.switched_on(self.family, self.config, what)

    def layer_kinds(self, n: int, stack: str = "encoder") -> list:
        """How each layer of `stack` attends over `n` positions (`posprobe.families.windows.LayerKind`)."""
        from posprobe.families.windows import layer_kinds

        key = ("layer_kinds", n, stack)
        if key not in self.cache:
            self.cache[key] = layer_kinds(self, n, stack)
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
        """The stored layer whose weights depth `layer` uses (0 at every depth of ALBERT)."""
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
        """The stored name ending in `pattern` (with `{l}` / `{stack}` filled in; of a group of alternatives
        'a.(b|c).d' the first the checkpoint holds), or None."""
        filled = pattern.format(l=layer, stack=stack)
        group = _ALTERNATIVES.search(filled)
        options = [filled] if group is None else [filled[: group.start()] + a + filled[group.end() :]
                                                  for a in group.group(1).split("|")]  # fmt: skip
        return next((k for k in map(self.reader.find_suffix, options) if k is not None), None)

    def tensor(self, pattern: str, layer: int | None = None, stack: str = "encoder") -> np.ndarray:
        """Tensor `pattern` (float64); a clear error when the checkpoint lacks it."""
        key = self.key(pattern, layer, stack)
        if key is None:
            suffix = pattern.format(l=layer, stack=stack)
            raise PosprobeError(
                f"checkpoint '{self.source.name}' has no tensor named '*{suffix}' for a {self.source.model_type} model",
                "the weights do not match config.json; re-save the checkpoint",
            )
        return self.reader.get(key)

    def optional(self, pattern: str, layer: int | None = None, stack: str = "encoder") -> np.ndarray | None:
        key = self.key(pattern, layer, stack)
        return None if key is None else self.reader.get(key)

    def norm(self, x: np.ndarray, prefix: str, layer: int | None = None, stack: str = "encoder") -> np.ndarray:
        """The family's norm with weights `prefix`.weight (and `.bias` when stored) applied to `x` (..., d)."""
        if self.family.norm == T.PLAIN_LAYERNORM:  # no weights stored (OLMo)
            return apply_norm(x, T.PLAIN_LAYERNORM, None, None, self.shape.eps)
        weight, bias = self.norm_weights(prefix, layer, stack)
        return apply_norm(x, self.family.norm, weight, bias, self.shape.eps)

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
        s, f = self.shape, self.family
        stored = self.stored_layer(layer)
        w = self.tensor(f.query + ".weight", stored, stack)
        b = self.optional(f.query + ".bias", stored, stack)
        try:
            if self.qkv in (T.SEPARATE, T.GROUPED_CONV):
                wk = self.tensor(f.key + ".weight", stored, stack)
                bk = self.optional(f.key + ".bias", stored, stack)
                if self.qkv == T.GROUPED_CONV:
                    w, wk = grouped_conv_dense(w, self.attention_width), grouped_conv_dense(wk, self.attention_width)
                q, k = head_split(w, b, s.heads, s.head_dim), head_split(wk, bk, s.kv_heads, s.head_dim)
            else:
                q, k = split_fused(self.qkv, w, b, s.heads, s.kv_heads, s.head_dim, f.qkv_blocks)
        except ValueError:  # a reshape that does not fit
            q = k = None
        width = q[0].shape[1] if q is not None else None
        if q is None or k[0].shape[1] != width or width != self.attention_width:
            raise PosprobeError(
                f"query/key weights of '{self.source.name}' layer {layer} do not match config.json "
                f"({s.heads} heads of size {s.head_dim}, {s.kv_heads} key heads)",
                _MIXED_HINT,
            )
        if "q_bias" in f.tensors:  # a query bias stored apart from the projection (DeBERTa v1)
            q = q[0], self.tensor(f.tensors["q_bias"], stored, stack).reshape(s.heads, s.head_dim)
        weights = HeadWeights(q[0], q[1], k[0], k[1], stored)
        prefix = self.bottleneck_prefix
        return weights if prefix is None else _fold(weights, *self.bottleneck(prefix, stored, stack))

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

    # -- embedding-level inputs --------------------------------------------------------------------
    @cached_property
    def word_mean(self) -> np.ndarray:
        """Vocabulary-average word embedding e_w (e,), read a chunk of rows at a time."""
        key = self.key(self.family.word)
        if key is None:
            self.tensor(self.family.word)  # raises the clear error
        shape, vocab = self.reader.shape(key), self.shape.vocab
        if vocab is not None and shape and len(shape) == 2 and shape[0] != vocab:  # a config.json from elsewhere
            raise mixed_checkpoint(self.source.name, "vocab_size =", vocab, f"a word table of {shape[0]} rows")
        return self.reader.row_mean(key)

    @property
    def word_dtype(self) -> str | None:
        """The stored dtype of the word table ('F32', 'BF16', ...; None when unknown)."""
        return self.reader.stored_dtype(self.key(self.family.word))

    @cached_property
    def scaled_word(self) -> np.ndarray:
        """e_w times the factor the family multiplies its word embeddings by (`Family.embed_scale`) (e,)."""
        scale, cfg = self.family.embed_scale, self.config
        if scale == "sqrt_hidden":
            return self.word_mean * embed_scale(self.shape.hidden, self.word_dtype)
        if scale in ("scale_embedding", "rescale_embeddings") and T.config_flag(cfg, scale):
            return self.word_mean * math.sqrt(self.shape.hidden)  # the model scales words, not positions
        if scale == "token_dropout" and T.config_flag(cfg, scale):  # ESM: no mask token in the sequence
            return self.word_mean * (1 - 0.15 * 0.8) / 1.0
        if scale == "embedding_multiplier":
            value = cfg.get(scale) if cfg.get(scale) is not None else config_default(cfg, (scale,))
            return self.word_mean * float(1.0 if value is None else value)
        return self.word_mean

    def word_rows(self, n: int | None = None) -> np.ndarray:
        """The word part of the embedding of a sequence of n average words, (n, e) (one row when n is None), in
        the width positions are added in: scaled, through the word projection where the family has one (with
        trigram input: [next; this; previous] words, zeros beyond the ends, so rows 0 and n - 1 differ)."""
        x = self.scaled_word
        rows = 1 if n is None else n
        projection = self.word_projection()
        if projection is None:
            return np.broadcast_to(x, (rows, x.shape[0]))
        w, b = projection
        if w.shape[1] == x.shape[0]:
            return np.broadcast_to(x @ w.T + b, (rows, w.shape[0]))
        if n is None:  # trigram, one interior row
            return (np.concatenate([x, x, x]) @ w.T + b)[None]
        nxt = np.where(np.arange(n)[:, None] < n - 1, x, 0.0)
        prev = np.where(np.arange(n)[:, None] > 0, x, 0.0)
        return np.concatenate([nxt, np.broadcast_to(x, (n, x.shape[0])), prev], axis=1) @ w.T + b

    def word_projection(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The Linear the word embedding goes through before positions are added (W (d, e or 3e), b), where the
        model applies it (trigram input, or a word width other than the hidden size), else None."""
        f = self.family
        if not f.word_projection or self.key(f.word_projection + ".weight") is None:
            return None
        trigram = "trigram" in f.switches and self.switched_on("trigram")
        if not trigram and self.word_mean.shape[0] == self.shape.hidden:
            return None  # MobileBERT without trigram input and of equal widths does not apply it
        return self.linear(f.word_projection)

    @cached_property
    def word(self) -> np.ndarray:
        """e_w as the model feeds it (e,): scaled, projected where the family projects words, as in the interior
        of a sequence."""
        return self.word_rows()[0]

    @cached_property
    def token_type0(self) -> np.ndarray | None:
        """What every token adds besides word and position (e,): token type 0's embedding and row 0 of the
        family's `constant_rows` tables (LayoutLM's box 0), else None."""
        f = self.family
        names = ((f.token_type,) if f.token_type else ()) + f.constant_rows
        rows = [self.reader.get(key)[0] for key in map(self.key, names) if key is not None]
        return sum(rows[1:], rows[0]) if rows else None

    @cached_property
    def position_table(self) -> PositionTable:
        """The absolute position table (n, e): stored (reserved and offset leading rows dropped) or, for a
        sinusoidal family that does not store it, built as the model builds it. Refused for a model without one."""
        self.require_table()
        f, cfg, name = self.family, self.config, self.source.name
        stored = self.key(f.position) if f.position else None
        if stored is None and "positions_class" in f.tensors:  # a sinusoidal table the model builds
            from posprobe.families.sinusoidal import build_table

            n = config_size(cfg, name, "positions")
            return PositionTable(name, self.source.model_type, build_table(f, cfg, n, self.shape.hidden), 0)
        table = self.tensor(f.position)
        if table.ndim != 2:
            raise PosprobeError(
                f"position table of '{name}' has shape {table.shape}, expected 2-D", "the checkpoint is malformed"
            )
        reserved = reserved_rows(cfg, name)
        dropped = reserved + f.position_offset
        stored_rows = table.shape[0]
        table = table[dropped:]
        if table.shape[0] < 2:
            raise PosprobeError(
                f"position table of '{name}' has {'only 1 usable row' if len(table) else 'no usable rows'}"
                + (f" (after dropping {dropped} reserved ones)" if dropped else ""),
                "a position analysis needs at least 2 positions; the checkpoint is malformed",
            )
        key = next((k for k in T.CONFIG_KEYS["positions"] if cfg.get(k) is not None), None)
        rows = cfg.get(key) if key else None
        if isinstance(rows, int) and not isinstance(rows, bool) and rows + f.position_offset != stored_rows:
            said = f"{rows} ({reserved} reserved + {rows - reserved} positions)" if reserved else str(rows)
            held = f"a position table of {stored_rows} rows" + (
                f" (the model reads rows {f.position_offset}.. for its {rows} positions)" if f.position_offset else ""
            )
            raise mixed_checkpoint(name, f"{key} =", said, held)  # fmt: skip
        if self.word.shape != (table.shape[1],):
            raise PosprobeError(
                f"word and position embeddings of '{name}' have different widths", "the checkpoint is malformed"
            )
        return PositionTable(name, self.source.model_type, table, dropped)

    def projection(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The factorised embedding's projection (W (d, e), b (d,)) where the checkpoint stores one, else None."""
        if not self.family.projection or self.key(self.family.projection + ".weight") is None:
            return None
        return self.linear(self.family.projection)

    def embedding_rows(self, positions: np.ndarray | None = None) -> np.ndarray:
        """What the first layer receives for a sequence of the average word (n, d): the word rows (scaled and
        projected as the model does) plus `positions` (n, e) rows when given (else one row), plus token type 0 and
        the constant rows, through the embedding norm and the factorised projection in the family's order."""
        x = self.word_rows(None if positions is None else len(positions))
        x = x if positions is None else positions + x
        if self.token_type0 is not None:
            x = x + self.token_type0[None, :]
        projection = self.projection()
        if projection is not None and self.family.projection_first:
            x = x @ projection[0].T + projection[1]
        if self.family.embedding_norm and self.switched_on("embedding_norm"):
            x = self.norm(x, self.family.embedding_norm)
        if projection is not None and not self.family.projection_first:
            x = x @ projection[0].T + projection[1]
        return x

    @cached_property
    def embedding(self) -> np.ndarray:
        """The embedding-level input of every position without a position term (d,): e_w scaled, normed and
        projected as the model does."""
        return self.embedding_rows()[0]

    def layer_input(self, x: np.ndarray, layer: int, stack: str = "encoder") -> np.ndarray:
        """Embedding-level rows x (..., d) as layer `layer`'s attention projections see them: after the layer's
        pre-attention norm where it has one (SPEC §9: layer l's weights act on the embedding-level input)."""
        f = self.family
        if f.pre_norm and layer >= f.pre_norm_from and self.switched_on("pre_norm"):
            x = self.norm(x, f.pre_norm, self.stored_layer(layer), stack)
        return x

    def word_input(self, layer: int, stack: str = "encoder") -> np.ndarray:
        """What layer `layer`'s attention projections see for the average word (d,)."""
        return self.layer_input(self.embedding, layer, stack)

    def query_key(self, layer: int, stack: str = "encoder") -> tuple[np.ndarray, np.ndarray]:
        """Query (H, d_h) and key (H_kv, d_h) of the average word at `layer`, biases, clamps and q/k norms
        applied, before any positional mechanism."""
        weights = self.attention(layer, stack)
        x = self.word_input(layer, stack)
        q, k = weights.queries(x), weights.keys(x)
        clip = self.config.get(self.family.clip) if self.family.clip else None
        if clip is not None:  # OLMo's clip_qkv
            q, k = np.clip(q, -clip, clip), np.clip(k, -clip, clip)
        return self.qk_norm(q, k, layer, stack)

    def qk_norm(self, q: np.ndarray, k: np.ndarray, layer: int, stack: str = "encoder"):
        """The family's q/k norms where the checkpoint has them (Qwen3, Phi with qk_layernorm, Cohere, StableLM,
        Persimmon, OLMo-2): q (H, ..., d_h), k (H_kv, ..., d_h) normalised per head over d_h (one weight for all
        heads, or one per head), or over the whole projection (`Family.qk_norm_scope` 'all')."""
        f, stored = self.family, self.stored_layer(layer)
        if not f.qk_norm or not self.switched_on("qk_norm"):
            return q, k
        first = f.qk_norm[0].replace("{h}", "0")
        if not (self.key(first + ".weight", stored, stack) or self.key(first + ".gamma", stored, stack)):
            return q, k
        return self._qk_normed(q, f.qk_norm[0], stored, stack), self._qk_normed(k, f.qk_norm[1], stored, stack)

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
            out = apply_norm(flat, self.family.norm, weight, bias, self.shape.eps)
            return np.moveaxis(out.reshape(*x.shape[1:-1], heads, x.shape[-1]), -2, 0)
        shape = (heads,) + (1,) * (x.ndim - 2) + (x.shape[-1],)
        weight = weight.reshape(shape) if weight.ndim == 2 else weight
        bias = bias.reshape(shape) if bias is not None and bias.ndim == 2 else bias
        return apply_norm(x, self.family.norm, weight, bias, self.shape.eps)

    def _weights(self, prefix: str, layer: int, stack: str) -> tuple[np.ndarray, np.ndarray | None]:
        return self.norm_weights(prefix, layer, stack)

    # -- how scores are formed ----------------------------------------------------------------------
    @property
    def scaling(self) -> float:
        """The factor q.k is multiplied by before softmax (`Family.scaling`): 1 / sqrt(d_h), 1 ('none'),
        config[KEY] ** -0.5 ('rsqrt:KEY': Gemma 2's query_pre_attn_scalar), config[KEY] ('value:KEY': Granite's
        attention_multiplier), or DeBERTa's 1 / sqrt(d_h * (1 + position terms)) rounded to float32."""
        how = self.family.scaling
        if how == "none":
            return 1.0
        if how == "head_dim":
            return self.shape.head_dim**-0.5
        if how == "disentangled":
            return 1.0 / disentangled_scale(self.config, self.shape.head_dim, self.family)
        rule, key = how.split(":")
        value = self.config.get(key)
        value = value if value is not None else config_default(self.config, (key,))
        if value is None:
            raise PosprobeError(
                f"config.json of '{self.source.name}' lacks '{key}', which sets its attention scale",
                "re-save the checkpoint with `save_pretrained` (it writes every field)",
            )
        return float(value) ** -0.5 if rule == "rsqrt" else float(value)

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


def _fold(weights: HeadWeights, a: np.ndarray, c: np.ndarray) -> HeadWeights:
    """Q/K weights applied after an affine map x -> x @ a + c, as weights on x itself (exact)."""
    wq, wk = np.einsum("de,hef->hdf", a, weights.wq), np.einsum("de,hef->hdf", a, weights.wk)
    bq, bk = weights.bq + np.einsum("e,hef->hf", c, weights.wq), weights.bk + np.einsum("e,hef->hf", c, weights.wk)
    return HeadWeights(wq, bq, wk, bk, weights.stored_layer)


_ALTERNATIVES = re.compile(r"\(([^()|]+(?:\|[^()|]+)+)\)")


CONTENT_FREE = "content-free"  # the mode of families without an absolute table (SPEC §9)


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
    if family is None:
        raise PosprobeError(
            f"'{source.name}' has unsupported architecture '{model_type}'",
            f"supported: {', '.join(T.model_types(analysable=True))}",
        )
    kind, mechanism = T.position_kind(cfg)
    table = kind in T.TABLE_KINDS and any(k in T.TABLE_KINDS for k in family.kinds)
    scores = kind in family.kinds and kind in T.SCORE_MODULES
    if family.analysable and (table or scores):
        return family
    raise PosprobeError(
        f"'{source.name}' ({model_type}) uses {mechanism}; posprobe does not read this model yet",
        f"the README's table lists the families posprobe reads ({', '.join(T.model_types(analysable=True))})",
    )


def content_free_scores(ctx: ModelContext, layer: int, n: int, stack: str = "encoder") -> np.ndarray:
    """F_hat (H, n, n) of SPEC §3 / §9 for `layer` of `stack`: dispatched to the score module of the model's kind."""
    return importlib.import_module(T.SCORE_MODULES[ctx.kind]).content_free_scores(ctx, layer, n, stack)
