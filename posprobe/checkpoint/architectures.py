"""Reading the tensors of learned-position-table families (where they live: `posprobe.families.table`).

Conventions of the returned arrays (all float64, row-vector convention):
- position table `(n, e)` with reserved leading rows already dropped (RoBERTa family),
- `e` = embedding width; `d` = hidden width; they differ for factorised embeddings (ALBERT, ELECTRA-small),
- Q/K weights in torch `Linear` layout `(out=d, in=d)`, so `q = x @ W.T + b`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from posprobe.checkpoint.config import config_float, config_int
from posprobe.checkpoint.resolve import ModelSource
from posprobe.checkpoint.weights import WeightReader
from posprobe.errors import PosprobeError
from posprobe.families.table import (
    CONFIG_KEYS,
    GPT2_CONV1D,
    TABLE_KINDS,
    Family,
    config_value,
    family_for_type,
    model_types,
    position_kind,
)

# Families whose absolute position table (learned, or sinusoidal as the model builds it) posprobe reads.
SUPPORTED_MODEL_TYPES = tuple(t for kind in TABLE_KINDS for t in model_types(kind=kind, analysable=True))


@dataclass(frozen=True)
class ModelShape:
    """Sizes read from config.json: heads H, layers L, hidden d, head size d_h = d / H."""

    model_type: str
    n_heads: int
    n_layers: int
    hidden: int
    layernorm_eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


@dataclass(frozen=True)
class PositionTable:
    """Learned absolute position embeddings `table` (n, e); `dropped_rows` reserved rows were removed."""

    model: str
    model_type: str
    table: np.ndarray
    dropped_rows: int

    @property
    def n_positions(self) -> int:
        return self.table.shape[0]


@dataclass(frozen=True)
class EmbeddingInputs:
    """What enters the first layer, split into its parts (all in the embedding width e).

    `positions` (n, e); `word_mean` (e,) = vocabulary-average word embedding; `token_type0` (e,) or None;
    `layernorm` (weight, bias, eps) or None; `projection` (W (d, e), b (d,)) or None.
    """

    positions: PositionTable
    word_mean: np.ndarray
    token_type0: np.ndarray | None
    layernorm: tuple[np.ndarray, np.ndarray, float] | None
    projection: tuple[np.ndarray, np.ndarray] | None


@dataclass(frozen=True)
class AttentionWeights:
    """Q/K projections of one layer, torch Linear layout: `wq`, `wk` (d, d); `bq`, `bk` (d,).

    `pre_layernorm` (weight, bias, eps) is the pre-LN applied to the layer input (GPT-2), else None.
    `weights_layer` is the stored layer the weights came from (0 for every depth of ALBERT).
    """

    layer: int
    weights_layer: int
    shape: ModelShape
    wq: np.ndarray
    bq: np.ndarray
    wk: np.ndarray
    bk: np.ndarray
    pre_layernorm: tuple[np.ndarray, np.ndarray, float] | None


def model_shape(source: ModelSource) -> ModelShape:
    """Heads, layers and widths from config.json, whatever the family calls them."""
    cfg = source.config
    family_of(source)  # refuses a family without a table posprobe reads, naming what it uses instead
    n_heads = config_int(cfg, source.name, *CONFIG_KEYS["heads"])
    n_layers = config_int(cfg, source.name, *CONFIG_KEYS["layers"])
    hidden = config_int(cfg, source.name, *CONFIG_KEYS["hidden"])
    if hidden % n_heads:
        raise PosprobeError(
            f"config.json of '{source.name}' has hidden size {hidden} not divisible by {n_heads} heads",
            "the config is malformed; re-save the checkpoint",
        )
    keys = ("layer_norm_eps", "layer_norm_epsilon")
    if all(cfg.get(k) is None for k in keys):  # a hand-written config: what the model's own config class uses
        from posprobe.families.context import config_default

        default_eps = config_default(cfg, keys) or 1e-12
    else:
        default_eps = None
    eps = config_float(cfg, source.name, *keys, default=default_eps, positive=True)
    return ModelShape(source.model_type, n_heads, n_layers, hidden, eps)


def family_of(source: ModelSource) -> Family:
    """The table entry of `source` when it has an absolute position table posprobe reads (learned, sinusoidal,
    or a learned table beside a relative mechanism, as MPNet's); a clear error otherwise (naming what the
    family uses instead)."""
    model_type = source.model_type
    cfg = source.config
    family = family_for_type(model_type)
    kind, mechanism = position_kind(cfg)
    if family is None:
        raise PosprobeError(
            f"'{source.name}' has unsupported architecture '{model_type}'",
            f"supported: {', '.join(model_types(analysable=True))}",
        )
    table = (kind in TABLE_KINDS and family.kind in TABLE_KINDS) or (family.learned_table and kind == family.kind)
    if not table or not family.analysable:
        scores = family.analysable and kind == family.kind and kind not in TABLE_KINDS  # read, but has no table
        raise PosprobeError(
            f"'{source.name}' ({model_type}) uses {mechanism}"
            + ("; it has no learned position table" if scores else "; posprobe does not read this model yet"),
            "`posprobe profiles` and `posprobe fhat` show its positional structure"
            if scores
            else f"the README's table lists the families posprobe reads ({', '.join(model_types(analysable=True))})",
        )
    if model_type == "albert" and config_int(cfg, source.name, "num_hidden_groups", default=1) != 1:
        raise PosprobeError(
            f"'{source.name}' is an ALBERT with {cfg.get('num_hidden_groups')} layer groups",
            "posprobe analyses ALBERT checkpoints with one shared layer group (all released ones)",
        )
    return family


def reserved_rows(config: dict, name: str) -> int:
    """Leading rows of the position table that no position uses: pad_token_id + 1 in the RoBERTa family (SPEC
    §1), 0 elsewhere. A RoBERTa-family config without a pad_token_id is refused (the model cannot number
    positions without it)."""
    family = family_for_type(str(config.get("model_type", "")))
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
    return PosprobeError(
        f"config.json of '{name}' says {what} {config_says} but the weights hold {weights_hold}",
        "the folder mixes files from two checkpoints; re-download it",
    )


def read_position_table(source: ModelSource, reader: WeightReader | None = None) -> PositionTable:
    """The learned position table `(n, e)`; RoBERTa-family reserved rows (padding_idx + 1) dropped."""
    family = family_of(source)
    reader = reader or WeightReader(source.path, source.weight_format)
    stored = reader.find_suffix(family.position) if family.position else None
    if stored is None and "positions_class" in family.tensors:  # a sinusoidal table the model builds
        from posprobe.families.sinusoidal import build_table

        n = config_int(source.config, source.name, *CONFIG_KEYS["positions"])
        table = build_table(family, source.config, n, config_int(source.config, source.name, *CONFIG_KEYS["hidden"]))
        return PositionTable(source.name, source.model_type, table, 0)
    table = reader.get(stored or _require(reader, family.position, source))
    if table.ndim != 2:
        raise PosprobeError(
            f"position table of '{source.name}' has shape {table.shape}, expected 2-D", "the checkpoint is malformed"
        )
    dropped = reserved_rows(source.config, source.name)
    table = table[dropped:]
    if table.shape[0] < 2:
        raise PosprobeError(
            f"position table of '{source.name}' has {'only 1 usable row' if len(table) else 'no usable rows'}"
            + (f" (after dropping {dropped} reserved ones)" if dropped else ""),
            "a position analysis needs at least 2 positions; the checkpoint is malformed",
        )
    key = next((k for k in CONFIG_KEYS["positions"] if source.config.get(k) is not None), None)
    rows = source.config.get(key) if key else None
    if isinstance(rows, int) and not isinstance(rows, bool) and rows != table.shape[0] + dropped:
        reserved = f" ({dropped} reserved + {rows - dropped} positions)" if dropped else ""
        raise mixed_checkpoint(source.name, f"{key} =", f"{rows}{reserved}",
                               f"a position table of {table.shape[0] + dropped} rows")  # fmt: skip
    return PositionTable(source.name, source.model_type, table, dropped)


def check_vocabulary(source: ModelSource, reader, word_key: str) -> None:
    """Refuse a config.json whose vocab_size disagrees with the word table's rows."""
    vocab = config_value(source.config, "vocab")
    shape = getattr(getattr(reader, "_entries", {}).get(word_key), "shape", None)
    if shape is None:
        state = getattr(reader, "_state", None)
        shape = tuple(state[word_key].shape) if state is not None and word_key in state else None
    if isinstance(vocab, int) and not isinstance(vocab, bool) and shape and len(shape) == 2 and shape[0] != vocab:
        raise mixed_checkpoint(source.name, "vocab_size =", vocab, f"a word table of {shape[0]} rows")


def read_embedding_inputs(source: ModelSource, reader: WeightReader | None = None) -> EmbeddingInputs:
    """Position table plus everything else that shapes the first layer's input."""
    family = family_of(source)
    reader = reader or WeightReader(source.path, source.weight_format)
    positions = read_position_table(source, reader)
    word_key = _require(reader, family.word, source)
    check_vocabulary(source, reader, word_key)
    word_mean = reader.row_mean(word_key)
    if family.embed_scale == "scale_embedding" and source.config.get("scale_embedding"):
        word_mean = word_mean * math.sqrt(model_shape(source).hidden)  # the model scales words, not positions
    token_type0 = None
    if family.token_type and (key := reader.find_suffix(family.token_type)):
        token_type0 = reader.get(key)[0]
    eps = model_shape(source).layernorm_eps
    layernorm = _layernorm(reader, family.embedding_norm, eps, source) if family.embedding_norm else None
    projection = None
    if family.projection and (key := reader.find_suffix(family.projection + ".weight")):
        projection = (reader.get(key), reader.get(_require(reader, family.projection + ".bias", source)))
    e = positions.table.shape[1]
    if word_mean.shape != (e,):
        raise PosprobeError(
            f"word and position embeddings of '{source.name}' have different widths", "the checkpoint is malformed"
        )
    return EmbeddingInputs(positions, word_mean, token_type0, layernorm, projection)


def read_attention_weights(source: ModelSource, layer: int, reader: WeightReader | None = None) -> AttentionWeights:
    """Q/K weights and biases of `layer` (ALBERT: its one shared layer, for every depth)."""
    family = family_of(source)
    shape = model_shape(source)
    if not 0 <= layer < shape.n_layers:
        raise PosprobeError(
            f"layer {layer} does not exist; '{source.name}' has layers 0..{shape.n_layers - 1}",
            "pick a layer with --layer",
        )
    reader = reader or WeightReader(source.path, source.weight_format)
    stored = 0 if family.shared_layers else layer
    d = shape.hidden
    if family.qkv == GPT2_CONV1D:  # GPT-2 Conv1D: y = x @ W + b, W (d, 3d) = [q | k | v]
        w = reader.get(_require(reader, family.query.format(l=stored) + ".weight", source))
        b = reader.get(_require(reader, family.query.format(l=stored) + ".bias", source))
        wq, wk = w[:, :d].T, w[:, d : 2 * d].T
        bq, bk = b[:d], b[d : 2 * d]
    else:
        wq = reader.get(_require(reader, family.query.format(l=stored) + ".weight", source))
        wk = reader.get(_require(reader, family.key.format(l=stored) + ".weight", source))
        bq = _bias_or_zero(reader, family.query.format(l=stored) + ".bias", d)
        bk = _bias_or_zero(reader, family.key.format(l=stored) + ".bias", d)
    pre_ln = None
    if family.pre_norm:
        pre_ln = _layernorm(reader, family.pre_norm.format(l=stored), shape.layernorm_eps, source)
    if wq.shape != (d, wq.shape[1]) or wk.shape != wq.shape:
        raise PosprobeError(
            f"query/key weights of '{source.name}' layer {layer} have unexpected shapes", "the checkpoint is malformed"
        )
    return AttentionWeights(layer, stored, shape, wq, bq, wk, bk, pre_ln)


def _layernorm(reader: WeightReader, prefix: str, eps: float, source: ModelSource):
    weight = reader.get(_require(reader, prefix + ".weight", source))
    bias = reader.get(_require(reader, prefix + ".bias", source))
    return weight, bias, eps


def _bias_or_zero(reader: WeightReader, suffix: str, d: int) -> np.ndarray:
    key = reader.find_suffix(suffix)
    return reader.get(key) if key else np.zeros(d)


def _require(reader: WeightReader, suffix: str, source: ModelSource) -> str:
    key = reader.find_suffix(suffix)
    if key is None:
        raise PosprobeError(
            f"checkpoint '{source.name}' has no tensor named '*{suffix}' for a {source.model_type} model",
            "the weights do not match config.json; re-save the checkpoint",
        )
    return key
