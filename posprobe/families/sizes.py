"""A model's sizes from its config.json, read under whatever names its family uses (`table.CONFIG_KEYS`), checked.

`Shape` (heads, key heads, head size, widths, layers, norm epsilon, position limit, vocabulary), `config_size`,
the reserved leading rows of a position table (`reserved_rows`) and the error for a config.json that disagrees
with the weights beside it (`mixed_checkpoint`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from posprobe.checkpoint.config import config_hint, config_int, config_where
from posprobe.errors import PosprobeError
from posprobe.families import table as T
from posprobe.families.table import config_default

CONFIG_HINT = "fix config.json or re-save the checkpoint with `save_pretrained`"
MIXED_HINT = "the folder mixes files from two checkpoints; re-download it"


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
    where = config_where(name) if name else "the config"
    value = T.config_value(config, what)
    if value is None:
        if default is not None or not required:
            return default
        raise PosprobeError(
            f"{where} has no {what} field (looked for {', '.join(T.CONFIG_KEYS[what])})", config_hint(name or "")
        )
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        key = next(k for k in T.CONFIG_KEYS[what] if T.config_get(config, k) is not None)
        raise PosprobeError(f"{where} has {key} = {value!r}, expected a whole number >= 1", config_hint(name or ""))
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
            f"{config_where(name)} has hidden size {width} not divisible by {heads} heads",
            config_hint(name, "the config is malformed; re-save the checkpoint"),
        )
    if heads % kv_heads:
        raise PosprobeError(
            f"{config_where(name)} has {heads} query heads, not a multiple of {kv_heads} key/value heads",
            config_hint(name, "the config is malformed; re-save the checkpoint"),
        )
    eps = family.eps if family.eps is not None else T.config_value(config, "eps")  # the family's code decides first
    if family.rms_when and T.config_get(config, family.rms_when) is not None:  # Cohere 2 MoE's RMS norms
        eps = T.config_get(config, family.rms_when)
    if eps is None:  # a hand-written config: its transformers config's default
        eps = config_default(config, T.CONFIG_KEYS["eps"])
        if eps is None:
            raise PosprobeError(
                f"{config_where(name)} gives no norm epsilon (looked for {', '.join(T.CONFIG_KEYS['eps'])})",
                config_hint(name, "add the model's layer_norm_eps / rms_norm_eps to config.json"),
            )
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0 or not math.isfinite(eps):
        raise PosprobeError(
            f"{config_where(name)} has a norm epsilon {eps!r}, expected a positive number", config_hint(name)
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
    if family.qkv == T.LATENT:  # MLA: each head's q and k hold the rotary and the position-free part
        head_dim = config_size(config, name, "latent_head_dim") + config_size(config, name, "latent_rope_dim")
        kv_heads = heads  # every head has its own key (one shared rotary part, its own position-free part)
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
            f"{config_where(name)} has pad_token_id null, but a {config.get('model_type')} position table "
            "reserves pad_token_id + 1 leading rows",
            "set pad_token_id in config.json (1 for RoBERTa, XLM-R and CamemBERT)",
        )
    return pad + 1


def mixed_checkpoint(name: str, what: str, config_says, weights_hold) -> PosprobeError:
    """The error for a config.json that disagrees with the weights beside it."""
    return PosprobeError(f"{config_where(name)} says {what} {config_says} but the weights hold {weights_hold}",
                         config_hint(name, MIXED_HINT))  # fmt: skip
