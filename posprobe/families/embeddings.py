"""The embedding level of a checkpoint: what its first layer receives for a sequence of the average word.

`EmbeddingReader` (mixed into `posprobe.families.context.ModelContext`, whose `key`, `tensor`, `optional`,
`linear`, `norm`, `switched_on`, `reader`, `family`, `config`, `shape` and `source` it uses) reads the
vocabulary-average word embedding e_w lazily, scales and projects it as the family does (`Family.embed_scale`,
`word_projection`, trigram input, tables joined to the word), adds token type 0 and the constant rows, the position
table (stored, with reserved and offset rows dropped, or built sinusoidal), and applies the embedding norm and
factorised projection in the family's order. Also the norms themselves (`apply_norm`) and Gemma's dtype-rounded sqrt(d).

Shapes: e embedding width, d hidden width, n positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from posprobe.architectures import table as T
from posprobe.architectures.config import config_size, mixed_checkpoint, reserved_rows
from posprobe.architectures.table import config_default
from posprobe.errors import PosprobeError


def apply_norm(x: np.ndarray, kind: str, weight, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """The norm `kind` (table.NORMS) over the last axis of `x`, as torch computes it (biased variance); `weight`
    None for a norm without weights (OLMo's, NanoChat's)."""
    if kind == T.NONORM:
        out = x * weight
    elif kind == T.PLAIN_L2:  # onto the unit sphere (Dory): the sum of squares, not their mean
        out = x / np.sqrt((x**2).sum(axis=-1, keepdims=True) + eps)
    elif kind in (T.LAYERNORM, T.PLAIN_LAYERNORM, T.LAYERNORM_PLUS1):
        mean = x.mean(axis=-1, keepdims=True)
        out = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
        out = out if weight is None else out * (1.0 + weight if kind == T.LAYERNORM_PLUS1 else weight)
    else:
        out = x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps)
        out = out if weight is None else out * (1.0 + weight if kind == T.RMSNORM_PLUS1 else weight)
    return out if bias is None else out + bias


def embed_scale(hidden: int, dtype: str | None) -> float:
    """sqrt(d) rounded to the word table's dtype, as Gemma's scaled embedding multiplies by it."""
    import torch

    torch_dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}.get(dtype or "", torch.float64)
    return float(torch.tensor(hidden**0.5).to(torch_dtype).double())


@dataclass(frozen=True)
class PositionTable:
    """An absolute position table `table` (n, e) (learned, or sinusoidal as the model builds it); `dropped_rows`
    leading rows no position reads were removed (RoBERTa family, MPNet: reserved; OPT, BART: the offset)."""

    model: str
    model_type: str
    table: np.ndarray
    dropped_rows: int

    @property
    def n_positions(self) -> int:
        return self.table.shape[0]


class EmbeddingReader:
    """The embedding-level inputs of a `ModelContext` (see the module docstring)."""

    @cached_property
    def word_mean(self) -> np.ndarray:
        """Vocabulary-average word embedding e_w (e,), read a chunk of rows at a time."""
        if "codebook_words" in self.family.tensors:  # MusicGen: one table per codebook, their embeddings summed
            return self.codebook_word_mean(self.family.tensors["codebook_words"])
        key = self.key(self.family.word)
        if key is None:
            self.tensor(self.family.word)  # raises the clear error
        shape, vocab = self.reader.shape(key), self.shape.vocab
        if vocab is not None:  # words beyond vocab_size the family's table holds (Moshi's: one), averaged with the rest
            vocab += int(self.family.tensors.get("more_words", 0))
        rows_after = self.family.extra_word_rows
        extra = math.prod(int(self.config.get(k) or 0) for k in rows_after) if rows_after else 0
        if vocab is not None and shape and len(shape) == 2 and shape[0] != vocab + extra:  # a config from elsewhere
            said = f"{vocab} (and {extra} further rows)" if extra else vocab
            raise mixed_checkpoint(self.source.name, "vocab_size =", said, f"a word table of {shape[0]} rows")
        if extra:  # rows after the vocabulary are no words (CPM-Ant's prompts): the vocabulary's mean alone
            return self.reader.get(key)[: shape[0] - extra].mean(axis=0)
        if "hash_words" in self.family.tensors:  # BLT: the byte's embedding plus one row of each hashed n-gram table
            from posprobe.families.stacked import hashed_ngram_mean

            return self.reader.row_mean(key) + hashed_ngram_mean(self)
        return self.reader.row_mean(key)

    def codebook_word_mean(self, pattern: str) -> np.ndarray:
        """The average input of one position of a model that sums one embedding per codebook (MusicGen: every
        codebook's stream has a token at every position): the sum over codebooks c of the average row of table
        `pattern` ('{c}' the codebook) (e,); the count of tables must be the config's (the first of the config keys
        `Family.tensors['codebooks']` names, comma-separated, that it holds)."""
        keys = []
        while (key := self.key(pattern.replace("{c}", str(len(keys))))) is not None:
            keys.append(key)
        if not keys:
            self.tensor(pattern.replace("{c}", "0"))  # raises the clear error
        said = [T.config_get(self.config, k) for k in self.family.tensors.get("codebooks", "").split(",") if k]
        said = next((n for n in said if n is not None), None)
        if said is not None and said != len(keys):
            raise mixed_checkpoint(self.source.name, "num_codebooks =", said, f"{len(keys)} codebook tables")
        return sum(self.reader.row_mean(key) for key in keys)

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
        if scale == "sqrt_hidden_bf16":  # RecurrentGemma's normalizer: a bfloat16 buffer, cast to the table's dtype
            return self.word_mean * embed_scale(self.shape.hidden, "BF16")
        if scale in ("scale_embedding", "rescale_embeddings", "mup_enabled") and T.config_flag(cfg, scale):
            return self.word_mean * math.sqrt(self.shape.hidden)  # the model scales words, not positions
        if scale == "token_dropout" and T.config_flag(cfg, scale):  # ESM: no mask token in the sequence
            return self.word_mean * (1 - 0.15 * 0.8) / 1.0
        if scale in ("embedding_multiplier", "scale_emb", "embedding_scale"):
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
        if self.family.word_concat:  # RoCBert: [word; row 0 of each enabled table]
            x = np.concatenate([x, *self.concatenated_rows()])
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
        if not f.word_projection or not self.switched_on("word_projection"):
            return None
        if self.key(f.word_projection + ".weight") is None:
            return None
        trigram = "trigram" in f.switches and self.switched_on("trigram")
        if not trigram and not f.word_concat and self.word_mean.shape[0] == self.shape.hidden:
            return None  # MobileBERT without trigram input and of equal widths does not apply it
        return self.linear(f.word_projection)

    def concatenated_rows(self) -> list[np.ndarray]:
        """Row 0 of each table `Family.word_concat` joins to the word embedding before the word projection, in
        order, where its config key is true (RoCBert's shape and pronunciation ids 0)."""
        return [self.tensor(name)[0] for key, name in self.family.word_concat if T.config_flag(self.config, key)]

    @cached_property
    def word(self) -> np.ndarray:
        """e_w as the model feeds it (e,): scaled, projected where the family projects words, as in the interior
        of a sequence."""
        return self.word_rows()[0]

    @cached_property
    def token_type0(self) -> np.ndarray | None:
        """What every token adds besides word and position (e,): token type 0's embedding (the family's
        `token_type_row`: CPM-Ant's segment 2) and row 0 of its `constant_rows` tables (LayoutLM's box 0), else
        None."""
        f = self.family
        token_type = self.key(f.token_type) if f.token_type else None
        rows = [self.reader.get(token_type)[f.token_type_row]] if token_type is not None else []
        rows += [self.reader.get(key)[0] for key in map(self.key, f.constant_rows) if key is not None]
        return sum(rows[1:], rows[0]) if rows else None

    @cached_property
    def position_table(self) -> PositionTable:
        """The absolute position table (n, e): stored (reserved and offset leading rows dropped) or, for a
        sinusoidal family that does not store it, built as the model builds it. Refused for a model without one."""
        self.require_table()
        f, cfg, name = self.family, self.config, self.source.name
        stored = self.key(f.position) if f.position else None
        built = any(k in f.tensors for k in ("positions_class", "positions_function", "positions_table"))
        if "axial_factors" in f.tensors and T.config_flag(cfg, f.tensors["axial_switch"]):  # Reformer's axial table
            from posprobe.families.axial import axial_table

            return PositionTable(name, self.source.model_type, axial_table(self), 0)
        if stored is None and built:  # a sinusoidal table the model builds
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
        if "input_affine" in self.family.tensors:  # ZAYA: (x + b) * s before the layers ('(bias|scale)' names)
            bias, scale = self.family.tensors["input_affine"].strip("()").split("|")
            x = (x + self.tensor(bias)) * self.tensor(scale)
        return x

    @cached_property
    def embedding(self) -> np.ndarray:
        """The embedding-level input of every position without a position term (d,): e_w scaled, normed and
        projected as the model does."""
        return self.embedding_rows()[0]
