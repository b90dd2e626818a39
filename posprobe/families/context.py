"""`ModelContext`: lazy access to one checkpoint's tensors through its family entry, for the score functions.

Shapes: d hidden width, H query heads, H_kv key/value heads (grouped-query attention: query head h reads key
head h // (H / H_kv)), d_h head size, n positions. Weights use torch's Linear layout: q = x @ W.T + b.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from posprobe.errors import PosprobeError
from posprobe.families import table as T

if TYPE_CHECKING:
    from posprobe.checkpoint.resolve import ModelSource

STACKS = ("encoder", "decoder")


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


def _positive(config: dict, name: str, what: str, default=None) -> int | None:
    value = T.config_value(config, what)
    if value is None:
        if default is not None:
            return default
        raise PosprobeError(
            f"config.json of '{name}' has no {what} field (looked for {', '.join(T.CONFIG_KEYS[what])})",
            "fix config.json or re-save the checkpoint with `save_pretrained`",
        )
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PosprobeError(
            f"config.json of '{name}' has {what} = {value!r}, expected a whole number >= 1",
            "fix config.json or re-save the checkpoint with `save_pretrained`",
        )
    return value


def config_shape(config: dict, name: str, family: T.Family) -> Shape:
    """Heads, widths and layers of `config` under whatever names its family uses."""
    heads = _positive(config, name, "heads")
    hidden = _positive(config, name, "hidden")
    kv_heads = _positive(config, name, "kv_heads", default=heads)
    head_dim = _positive(config, name, "head_dim", default=hidden // heads)
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
    if eps is None:  # a hand-written config without it: the default of the family's own transformers config
        eps = config_default(config, T.CONFIG_KEYS["eps"])
        if eps is None:
            raise PosprobeError(
                f"config.json of '{name}' gives no norm epsilon (looked for {', '.join(T.CONFIG_KEYS['eps'])})",
                "add the model's layer_norm_eps / rms_norm_eps to config.json",
            )
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise PosprobeError(
            f"config.json of '{name}' has a norm epsilon {eps!r}, expected a positive number",
            "fix config.json or re-save the checkpoint with `save_pretrained`",
        )
    positions = T.config_value(config, "positions")
    positions = _positive(config, name, "positions") if positions is not None else None
    vocab = _positive(config, name, "vocab") if T.config_value(config, "vocab") is not None else None
    layers = _positive(config, name, "layers")
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


def apply_norm(x: np.ndarray, kind: str, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """The norm `kind` (table.NORMS) over the last axis of `x`, as torch computes it (biased variance)."""
    if kind == T.LAYERNORM:
        mean = x.mean(axis=-1, keepdims=True)
        out = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps) * weight
    else:
        out = x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps)
        out = out * (1.0 + weight if kind == T.RMSNORM_PLUS1 else weight)
    return out if bias is None else out + bias


class ModelContext:
    """One checkpoint seen through its family entry: `source`, `reader` (a WeightReader or StateDictReader:
    `get`, `find_suffix`, `row_mean`, all float64 numpy), `family`, `config`, `shape`."""

    def __init__(self, source: ModelSource, reader, family: T.Family | None = None):
        self.source, self.reader = source, reader
        self.family = family or T.family_for_type(source.model_type)
        if self.family is None:
            raise PosprobeError(f"'{source.name}' has unknown model type '{source.model_type}'")
        self.config = source.config
        self.shape = config_shape(self.config, source.name, self.family)
        self.cache: dict = {}  # what score functions compute once for every layer (e.g. rotary angles)

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

    # -- the constant input ---------------------------------------------------------------------------
    @cached_property
    def word_mean(self) -> np.ndarray:
        """Vocabulary-average word embedding e_w (e,), read a chunk of rows at a time."""
        from posprobe.checkpoint.architectures import check_vocabulary

        key = self.key(self.family.word)
        if key is None:
            self.tensor(self.family.word)  # raises the clear error
        check_vocabulary(self.source, self.reader, key)  # a config.json from another checkpoint is refused
        return self.reader.row_mean(key)

    @cached_property
    def embedding(self) -> np.ndarray:
        """The embedding-level input of every position (d,): e_w scaled and normed as the model does."""
        x = self.word_mean
        if self.family.embed_scale == "sqrt_hidden":
            x = x * embed_scale(self.shape.hidden, self.word_dtype)
        if self.family.embedding_norm:
            x = self.norm(x, self.family.embedding_norm)
        return x

    @property
    def word_dtype(self) -> str | None:
        """The stored dtype of the word table ('F32', 'BF16', ...; None when unknown)."""
        return self.reader.stored_dtype(self.key(self.family.word))

    def word_input(self, layer: int, stack: str = "encoder") -> np.ndarray:
        """What layer `layer`'s attention projections see for the average word (d,): the embedding-level
        input (SPEC §9: layer l's weights act on it) after the layer's pre-attention norm."""
        x = self.embedding
        if self.family.pre_norm:
            x = self.norm(x, self.family.pre_norm, layer, stack)
        return x

    def query_key(self, layer: int, stack: str = "encoder") -> tuple[np.ndarray, np.ndarray]:
        """Query (H, d_h) and key (H_kv, d_h) of the average word at `layer`, biases and per-head q/k norms
        applied, before any positional mechanism."""
        s, f = self.shape, self.family
        x = self.word_input(layer, stack)
        w = self.tensor(f.query + ".weight", layer, stack)
        b = self.optional(f.query + ".bias", layer, stack)
        y = x @ (w if f.qkv == T.GPT2_CONV1D else w.T) + (0.0 if b is None else b)
        qd, kd = s.heads * s.head_dim, s.kv_heads * s.head_dim
        if f.qkv == T.SEPARATE:
            wk = self.tensor(f.key + ".weight", layer, stack)
            bk = self.optional(f.key + ".bias", layer, stack)
            q, k = y, x @ wk.T + (0.0 if bk is None else bk)
        elif f.qkv == T.PER_HEAD:  # rows grouped per head: [q_h; k_h; v_h]
            per = y.reshape(s.heads, 3, s.head_dim)
            q, k = per[:, 0].reshape(-1), per[:, 1].reshape(-1)
        else:  # GPT2_CONV1D columns / STACKED rows: [q | k | v]
            q, k = y[:qd], y[qd : qd + kd]
        if q.shape != (qd,) or k.shape != (kd,):
            raise PosprobeError(
                f"query/key weights of '{self.source.name}' layer {layer} do not match config.json "
                f"({s.heads} heads of size {s.head_dim}, {s.kv_heads} key heads)",
                "the folder mixes files from two checkpoints; re-download it",
            )
        q, k = q.reshape(s.heads, s.head_dim), k.reshape(s.kv_heads, s.head_dim)
        if f.qk_norm and self.key(f.qk_norm[0] + ".weight", layer, stack):
            q = self.norm(q, f.qk_norm[0], layer, stack)
            k = self.norm(k, f.qk_norm[1], layer, stack)
        return q, k

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

    def causal(self, stack: str = "encoder") -> bool:
        """True when the model only lets query i see keys j <= i (k <= 0) in `stack`."""
        return self.family.causal or (self.family.encoder_decoder and stack == "decoder")

    def layers(self, stack: str = "encoder") -> int:
        """Number of attention layers of `stack`."""
        if stack == "decoder" and self.family.encoder_decoder:
            return int(self.config.get("num_decoder_layers") or self.shape.layers)
        return self.shape.layers


def embed_scale(hidden: int, dtype: str | None) -> float:
    """sqrt(d) rounded to the word table's dtype, as Gemma's scaled embedding multiplies by it."""
    import torch

    torch_dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}.get(dtype or "", torch.float64)
    return float(torch.tensor(hidden**0.5).to(torch_dtype).double())


def content_free_scores(ctx: ModelContext, layer: int, n: int, stack: str = "encoder") -> np.ndarray:
    """F_hat (H, n, n) of SPEC §9 for `layer` of `stack`: dispatched to the score module of the family's kind."""
    module = T.SCORE_MODULES.get(ctx.family.kind)
    if module is None:
        raise PosprobeError(
            f"'{ctx.source.name}' ({ctx.source.model_type}) uses {ctx.family.mechanism}, whose content-free scores "
            "posprobe does not compute"
        )
    return importlib.import_module(module).content_free_scores(ctx, layer, n, stack)
