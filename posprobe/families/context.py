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
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from posprobe.checkpoint.config import config_int
from posprobe.errors import PosprobeError
from posprobe.families import table as T

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
    kv_heads = config_size(config, name, "kv_heads", default=heads)
    head_dim = config_size(config, name, "head_dim", default=hidden // heads)
    if T.config_value(config, "head_dim") is None and hidden % heads:
        raise PosprobeError(
            f"config.json of '{name}' has hidden size {hidden} not divisible by {heads} heads",
            "the config is malformed; re-save the checkpoint",
        )
    if heads % kv_heads:
        raise PosprobeError(
            f"config.json of '{name}' has {heads} query heads, not a multiple of {kv_heads} key/value heads",
            "the config is malformed; re-save the checkpoint",
        )
    eps = T.config_value(config, "eps")
    if eps is None:  # fixed in the family's code, or (a hand-written config) its transformers config's default
        eps = family.eps if family.eps is not None else config_default(config, T.CONFIG_KEYS["eps"])
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


def config_default(config: dict, keys: tuple[str, ...]):
    """The first of `keys` set in the default config of `config`'s model type (transformers' config class), or
    None: what the model itself would use for a field its config.json leaves out."""
    try:
        from transformers import AutoConfig

        defaults = AutoConfig.for_model(str(config.get("model_type")))
    except Exception:  # an unknown model type: no defaults to offer
        return None
    return next((getattr(defaults, k) for k in keys if getattr(defaults, k, None) is not None), None)


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
def apply_norm(x: np.ndarray, kind: str, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """The norm `kind` (table.NORMS) over the last axis of `x`, as torch computes it (biased variance)."""
    if kind == T.LAYERNORM:
        mean = x.mean(axis=-1, keepdims=True)
        out = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps) * weight
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
    # rows (T, d) go through BLAS (one (T, d) x (d, d_h) product per head); other shapes through einsum
    out = np.matmul(x[None], w) if x.ndim == 2 else np.einsum("...d,hde->h...e", x, w)
    return out + b.reshape(b.shape[0], *([1] * (x.ndim - 1)), b.shape[1])


def head_split(w: np.ndarray, b: np.ndarray | None, heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Linear rows (heads * d_h, d) -> per-head (heads, d, d_h) and bias (heads, d_h)."""
    per = w.reshape(heads, head_dim, w.shape[-1]).transpose(0, 2, 1)
    bias = np.zeros((heads, head_dim)) if b is None else b.reshape(heads, head_dim)
    return np.ascontiguousarray(per), bias


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
        self.cache: dict = {}  # what score functions compute once for every layer (e.g. rotary angles)
        self.layer_inputs: dict[int, np.ndarray] | None = None  # data-conditioned inputs (SPEC §13), see below

    # -- what the model is --------------------------------------------------------------------------
    @property
    def has_table(self) -> bool:
        """True when the model has an absolute position table (learned, built sinusoidal, or beside a relative
        mechanism: MPNet): P = E_P E_P^T exists."""
        return _has_table(self.family, self.kind)

    @property
    def score_mode(self) -> str:
        """The mode results report: 'paper' / 'faithful' for absolute tables, 'content-free' otherwise, and
        'data-conditioned' while layer inputs from text are in use (`use_layer_inputs`)."""
        if self.conditioned:
            return DATA_CONDITIONED
        return self.mode if self.kind in T.TABLE_KINDS else CONTENT_FREE

    def require_table(self) -> None:
        """Refuse a model without an absolute position table, naming the commands that show its structure."""
        check_analysable(self.source, table=True)

    def causal(self, stack: str = "encoder") -> bool:
        """True when the model only lets query i see keys j <= i (k <= 0) in `stack`."""
        return self.family.causal or (self.family.encoder_decoder and stack == "decoder")

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
        if maximum and self.family.reserved_rows:
            maximum -= reserved_rows(self.config, self.source.name)
        return maximum

    # -- tensors ------------------------------------------------------------------------------------
    def key(self, pattern: str, layer: int | None = None, stack: str = "encoder") -> str | None:
        """The stored name ending in `pattern` (with `{l}` / `{stack}` filled in), or None."""
        return self.reader.find_suffix(pattern.format(l=layer, stack=stack))

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
        weight = self.tensor(prefix + ".weight", layer, stack)
        bias = self.optional(prefix + ".bias", layer, stack)
        return apply_norm(x, self.family.norm, weight, bias, self.shape.eps)

    def linear(self, prefix: str, layer: int | None = None, stack: str = "encoder") -> tuple[np.ndarray, np.ndarray]:
        """A stored Linear `prefix` as (W (out, in), b (out,)); b is zeros where no bias is stored."""
        w = self.tensor(prefix + ".weight", layer, stack)
        b = self.optional(prefix + ".bias", layer, stack)
        return w, np.zeros(w.shape[0]) if b is None else b

    def attention(self, layer: int, stack: str = "encoder") -> HeadWeights:
        """Per-head Q/K weights of depth `layer` of `stack`, whatever the family's layout (`Family.qkv`)."""
        s, f = self.shape, self.family
        stored = self.stored_layer(layer)
        w = self.tensor(f.query + ".weight", stored, stack)
        b = self.optional(f.query + ".bias", stored, stack)
        qd, kd = s.heads * s.head_dim, s.kv_heads * s.head_dim
        try:
            if f.qkv == T.SEPARATE:
                wk = self.tensor(f.key + ".weight", stored, stack)
                bk = self.optional(f.key + ".bias", stored, stack)
                q, k = head_split(w, b, s.heads, s.head_dim), head_split(wk, bk, s.kv_heads, s.head_dim)
            elif f.qkv == T.GPT2_CONV1D:  # Conv1D (d, 3d): y = x @ W + b, columns [q | k | v]
                wt, bias = w.T, (np.zeros(w.shape[1]) if b is None else b)
                q = head_split(wt[:qd], bias[:qd], s.heads, s.head_dim)
                k = head_split(wt[qd : qd + kd], bias[qd : qd + kd], s.kv_heads, s.head_dim)
            elif f.qkv == T.PER_HEAD:  # Linear rows grouped per head: [q_h; k_h; v_h]
                per = w.reshape(s.heads, 3, s.head_dim, w.shape[-1])
                bias = np.zeros((s.heads, 3, s.head_dim)) if b is None else b.reshape(s.heads, 3, s.head_dim)
                q = np.ascontiguousarray(per[:, 0].transpose(0, 2, 1)), bias[:, 0]
                k = np.ascontiguousarray(per[:, 1].transpose(0, 2, 1)), bias[:, 1]
            else:  # STACKED Linear rows [q (H d_h); k (H_kv d_h); v]
                bias = np.zeros(w.shape[0]) if b is None else b
                if w.shape[0] < qd + kd:
                    raise ValueError
                q = head_split(w[:qd], bias[:qd], s.heads, s.head_dim)
                k = head_split(w[qd : qd + kd], bias[qd : qd + kd], s.kv_heads, s.head_dim)
        except ValueError:  # a reshape that does not fit
            q = k = None
        hidden = q[0].shape[1] if q is not None else None
        if q is None or k[0].shape[1] != hidden or hidden != s.hidden:
            raise PosprobeError(
                f"query/key weights of '{self.source.name}' layer {layer} do not match config.json "
                f"({s.heads} heads of size {s.head_dim}, {s.kv_heads} key heads)",
                _MIXED_HINT,
            )
        return HeadWeights(q[0], q[1], k[0], k[1], stored)

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
    def word(self) -> np.ndarray:
        """e_w as the model feeds it (e,): times sqrt(d) where the family scales its word embeddings."""
        scale = self.family.embed_scale
        if scale == "sqrt_hidden":
            return self.word_mean * embed_scale(self.shape.hidden, self.word_dtype)
        if scale == "scale_embedding" and self.config.get("scale_embedding"):
            return self.word_mean * math.sqrt(self.shape.hidden)  # the model scales words, not positions
        return self.word_mean

    @cached_property
    def token_type0(self) -> np.ndarray | None:
        """Token type 0's embedding (e,) where the family adds one, else None."""
        key = self.key(self.family.token_type) if self.family.token_type else None
        return None if key is None else self.reader.get(key)[0]

    @cached_property
    def position_table(self) -> PositionTable:
        """The absolute position table (n, e): stored (reserved leading rows dropped) or, for a sinusoidal family
        that does not store it, built as the model builds it. Refused for a model without one."""
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
        dropped = reserved_rows(cfg, name)
        table = table[dropped:]
        if table.shape[0] < 2:
            raise PosprobeError(
                f"position table of '{name}' has {'only 1 usable row' if len(table) else 'no usable rows'}"
                + (f" (after dropping {dropped} reserved ones)" if dropped else ""),
                "a position analysis needs at least 2 positions; the checkpoint is malformed",
            )
        key = next((k for k in T.CONFIG_KEYS["positions"] if cfg.get(k) is not None), None)
        rows = cfg.get(key) if key else None
        if isinstance(rows, int) and not isinstance(rows, bool) and rows != table.shape[0] + dropped:
            reserved = f" ({dropped} reserved + {rows - dropped} positions)" if dropped else ""
            raise mixed_checkpoint(name, f"{key} =", f"{rows}{reserved}",
                                   f"a position table of {table.shape[0] + dropped} rows")  # fmt: skip
        if self.word_mean.shape != (table.shape[1],):
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
        """What the first layer receives for a sequence of the average word (n, d): e_w (scaled as the model
        scales it) plus `positions` (n, e) rows when given (else one row), plus token type 0, through the
        embedding norm and the factorised projection in the family's order."""
        x = self.word[None, :] if positions is None else positions + self.word[None, :]
        if self.token_type0 is not None:
            x = x + self.token_type0[None, :]
        projection = self.projection()
        if projection is not None and self.family.projection_first:
            x = x @ projection[0].T + projection[1]
        if self.family.embedding_norm:
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
        pre-attention norm (SPEC §9: layer l's weights act on the embedding-level input)."""
        if self.family.pre_norm:
            x = self.norm(x, self.family.pre_norm, self.stored_layer(layer), stack)
        return x

    # -- data-conditioned inputs (SPEC §13) ---------------------------------------------------------
    def use_layer_inputs(self, inputs: dict[int, np.ndarray] | None) -> None:
        """Feed depth `l` the hidden state `inputs[l]` in place of the embedding-level input: x_l (d,), the same at
        every position (SPEC §13 'mean'), or x_l(i) (n, d), one row per analysed position ('position-mean'), as
        transformers' `hidden_states[l]` (the residual stream before the layer's own norm). Everything after it
        (the layer's norm, projections, biases, q/k norms, positional mechanism, scaling, soft cap) is unchanged:
        every score module reads its input through `layer_rows` / `query_key`. None restores the embedding-level
        input. An absolute position table then enters only through x_l (the model added it before layer 0)."""
        if inputs is not None:
            inputs = {int(layer): np.asarray(x, dtype=np.float64) for layer, x in inputs.items()}
            widths = {x.shape[-1] for x in inputs.values()} | {self.shape.hidden}
            ranks = {x.ndim for x in inputs.values()}
            if len(widths) != 1 or not ranks <= {1, 2}:
                raise ValueError(f"layer inputs must be (d,) or (n, d) with d = {self.shape.hidden}")
        self.layer_inputs = inputs

    @property
    def conditioned(self) -> bool:
        """True while data-conditioned layer inputs are in use."""
        return self.layer_inputs is not None

    @property
    def per_position_input(self) -> bool:
        """True when the layer inputs differ along the sequence (SPEC §13 'position-mean')."""
        return self.conditioned and any(x.ndim == 2 for x in self.layer_inputs.values())

    def layer_rows(self, layer: int, stack: str = "encoder", positions: np.ndarray | None = None) -> np.ndarray:
        """Rows (m, d) that layer `layer`'s attention projections see, after its pre-attention norm: m = 1 for an
        input that is the same at every position, m = n for one row per position. By default the embedding-level
        input of the average word (plus `positions` (n, e) table rows where given: SPEC §3, §9); with
        data-conditioned inputs (`use_layer_inputs`) the hidden state entering the layer, `positions` ignored
        (the model already added its table before layer 0)."""
        if self.layer_inputs is None:
            x = self.embedding_rows(positions)
        elif layer not in self.layer_inputs:
            raise ValueError(f"no data-conditioned input was given for layer {layer}")
        else:
            x = np.atleast_2d(self.layer_inputs[layer])
        return self.layer_input(x, layer, stack)

    def word_input(self, layer: int, stack: str = "encoder") -> np.ndarray:
        """What layer `layer`'s attention projections see at every position (d,) — the average word, or a
        data-conditioned mean — or, for a per-position input, at each position (n, d)."""
        rows = self.layer_rows(layer, stack)
        return rows[0] if rows.shape[0] == 1 and not self.per_position_input else rows

    def query_key(self, layer: int, stack: str = "encoder") -> tuple[np.ndarray, np.ndarray]:
        """Query (H, d_h) and key (H_kv, d_h) of the input at `layer` (`word_input`), biases and per-head q/k
        norms applied, before any positional mechanism; (H, n, d_h) and (H_kv, n, d_h) for a per-position input."""
        weights = self.attention(layer, stack)
        x = self.word_input(layer, stack)
        q, k = weights.queries(x), weights.keys(x)
        return self.qk_norm(q, k, layer, stack)

    def query_key_of(self, hidden: np.ndarray, layer: int, stack: str = "encoder") -> tuple[np.ndarray, np.ndarray]:
        """Queries (H, T, d_h) and keys (H_kv, T, d_h) of hidden states `hidden` (T, d) entering layer `layer`
        (transformers' `hidden_states[layer]`: real tokens of real text), before any positional mechanism:
        `query_key`'s own path (the layer's norm, projections, biases, q/k norms) with those rows as the input."""
        saved = self.layer_inputs
        self.layer_inputs = {layer: np.atleast_2d(np.asarray(hidden, dtype=np.float64))}
        try:
            q, k = self.query_key(layer, stack)
        finally:
            self.layer_inputs = saved
        return (q, k) if q.ndim == 3 else (q[:, None], k[:, None])

    def qk_norm(self, q: np.ndarray, k: np.ndarray, layer: int, stack: str = "encoder"):
        """Per-head q/k norms (Qwen3, Phi with qk_layernorm) over the last axis where the checkpoint has them."""
        f, stored = self.family, self.stored_layer(layer)
        if f.qk_norm and self.key(f.qk_norm[0] + ".weight", stored, stack):
            q = self.norm(q, f.qk_norm[0], stored, stack)
            k = self.norm(k, f.qk_norm[1], stored, stack)
        return q, k

    # -- how scores are formed ----------------------------------------------------------------------
    @property
    def scaling(self) -> float:
        """The factor q.k is multiplied by before softmax: 1 / sqrt(d_h), 1 where `Family.scaling` is 'none', or
        config[Family.scaling] ** -0.5 (Gemma 2's query_pre_attn_scalar)."""
        if self.family.scaling == "none":
            return 1.0
        if self.family.scaling == "head_dim":
            return self.shape.head_dim**-0.5
        value = self.config.get(self.family.scaling)
        value = value if value is not None else config_default(self.config, (self.family.scaling,))
        if value is None:
            raise PosprobeError(
                f"config.json of '{self.source.name}' lacks '{self.family.scaling}', which sets its attention scale",
                "re-save the checkpoint with `save_pretrained` (it writes every field)",
            )
        return float(value) ** -0.5

    def softcap(self, scores: np.ndarray) -> np.ndarray:
        """The family's logit soft cap `cap * tanh(scores / cap)` where its config sets one; else `scores`."""
        cap = self.config.get(self.family.softcap) if self.family.softcap else None
        return scores if cap is None else cap * np.tanh(scores / cap)


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


def _has_table(family: T.Family, kind: str) -> bool:
    return kind in T.TABLE_KINDS or family.learned_table


def check_analysable(source: ModelSource, table: bool = False) -> T.Family:
    """The family-table entry of `source` when posprobe computes its positional scores (`table`: and it has an
    absolute position table, P = E_P E_P^T); else one clear error naming what the family uses instead. The one
    gatekeeper of what is analysable: cheap (config only), so callers run it before reading any weights."""
    family = _analysable_family(source)
    if table and not _has_table(family, T.position_kind(source.config)[0]):
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
    table = (kind in T.TABLE_KINDS and family.kind in T.TABLE_KINDS) or (family.learned_table and kind == family.kind)
    scores = family.analysable and kind == family.kind and kind in T.SCORE_MODULES
    if family.analysable and (table or scores):
        return family
    raise PosprobeError(
        f"'{source.name}' ({model_type}) uses {mechanism}; posprobe does not read this model yet",
        f"the README's table lists the families posprobe reads ({', '.join(T.model_types(analysable=True))})",
    )


def content_free_scores(ctx: ModelContext, layer: int, n: int, stack: str = "encoder") -> np.ndarray:
    """F_hat (H, n, n) of SPEC §3 / §9 for `layer` of `stack`: dispatched to the score module of the model's kind
    (SPEC §13 with data-conditioned layer inputs; a per-position input must have exactly n rows)."""
    if ctx.per_position_input and np.shape(ctx.layer_inputs.get(layer))[0] != n:
        raise ValueError(f"the per-position input of layer {layer} does not have {n} rows")
    return importlib.import_module(T.SCORE_MODULES[ctx.kind]).content_free_scores(ctx, layer, n, stack)


#: How a score matrix's input varies along the sequence: the same vector at every position (the average word
#: embedding e_w of SPEC §9, or one mean of real hidden states, SPEC §13 'mean'), or one per position (SPEC §13
#: 'position-mean').
SAME_INPUT = "same at every position"
PER_POSITION_INPUT = "per position"


def toeplitz_by_construction(ctx: ModelContext, stack: str = "encoder", input_mode: str = SAME_INPUT) -> bool:
    """True when the score matrices of this model (position kind, config) for inputs of `input_mode` depend on
    k = j - i alone whatever the weights, so their Toeplitz R^2 is 1 by construction and measures nothing: decided
    by the score module of the model's kind, never by testing numbers. An input that differs along the sequence
    (`PER_POSITION_INPUT`) makes no matrix Toeplitz by construction."""
    if input_mode not in (SAME_INPUT, PER_POSITION_INPUT):
        raise ValueError(f"input_mode must be {SAME_INPUT!r} or {PER_POSITION_INPUT!r}, got {input_mode!r}")
    if input_mode != SAME_INPUT:
        return False
    return bool(importlib.import_module(T.SCORE_MODULES[ctx.kind]).toeplitz_by_construction(ctx, stack))
