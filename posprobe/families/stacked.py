"""Stacks run one after another (`Family.stacks`, SPEC §9): BLT's byte encoder, global transformer and byte decoder.

posprobe numbers the layers of every stack in the order the model runs them (`table.stack_depths`); depth l is
stored layer l - (the layers of the stacks before it) of its stack, '{m}' its module in tensor names. The layers of
a stack over the text's own positions (BLT's bytes) are read, each on the embedding-level input as every layer is,
with its stack's own rotary setting and the causal window of the model's byte mask; a stack over other positions
(BLT's patches, pooled from the bytes by the encoder: no content-free input of its own) is a hybrid's other layers,
no positional score. Cross-attention between the stacks pairs positions of two sequences: no positional score.
The average input adds, to the average byte, the average row of each hashed n-gram table (`hashed_ngram_mean`).
"""

from __future__ import annotations

import importlib

import numpy as np

from posprobe.architectures import table as T
from posprobe.architectures.config import config_where, mixed_checkpoint
from posprobe.errors import PosprobeError

# sizes every stack over the text's positions must share: posprobe reads them from the first one (`Family.sizes`)
_SHARED = ("hidden_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps")


def stack_layers(ctx) -> list[tuple[str, int | None, dict | None]]:
    """(stack module, largest |j - i| attended, rope parameters) of every depth: a stack over the text's positions
    attends the causal window config[`tensors['window']`] (keys i - w < j <= i: reach w - 1; None, no limit, when
    unset) with its own section's rope parameters; a stack over other positions gets (module, None, None)."""
    f, cfg = ctx.family, ctx.transformers_config
    read = [(module, section) for module, section, on_text in f.stacks if on_text]
    first = getattr(cfg, read[0][1])
    for module, section in read[1:]:
        other = getattr(cfg, section)
        differs = [k for k in _SHARED if getattr(other, k, None) != getattr(first, k, None)]
        if differs:
            raise PosprobeError(
                f"{config_where(ctx.source.name)} gives its {module} other {', '.join(differs)} than its "
                f"{read[0][0]}: posprobe reads the stacks over the text's positions with one layout",
                "posprobe reads BLT checkpoints whose byte stacks share their sizes (the released ones)",
            )
    window = T.config_get(ctx.config, f.tensors["window"])
    reach = int(window) - 1 if window else None
    sections = dict(read)
    return [
        (module, reach, getattr(cfg, sections[module]).rope_parameters) if on_text else (module, None, None)
        for module, on_text, _ in T.stack_depths(f, ctx.config)
    ]


class StackRotary:
    """The family's own rotary module (`tensors['stack_rotary']`) of the stack `layer_type` names (its module), built
    from that stack's config section: `rotary_angles` calls it as the family's rotary module."""

    def __init__(self, config):
        self.config = config
        self.family = T.family_for_type(config.model_type)

    def forward(self, x, position_ids, layer_type: str | None = None):
        module_name, class_name = self.family.tensors["stack_rotary"].split(":")
        rotary_class = getattr(importlib.import_module(module_name), class_name)
        section = next(s for module, s, _ in self.family.stacks if module == layer_type)
        return rotary_class(config=getattr(self.config, section))(x, position_ids)

    __call__ = forward


def hashed_ngram_mean(ctx) -> np.ndarray:
    """(e,) the sum of the average rows of a model's hashed n-gram tables (BLT: one table per byte-group size and
    hash function, stored as one table `tensors['hash_words']` of equal slices of config[`tensors['hash_vocab']`]
    rows): each position adds one row of every slice, the row of the hash of the bytes ending there, so the content-
    free input takes every slice's average (SPEC §9), G times the mean of the whole table for G slices."""
    name, rows_key = ctx.family.tensors["hash_words"], ctx.family.tensors["hash_vocab"]
    key = ctx.key(name)
    if key is None:
        ctx.tensor(name)  # raises the clear error
    rows = ctx.reader.shape(key)[0]
    per_table = T.config_get(ctx.config, rows_key)
    per_table = per_table if per_table is not None else T.config_default(ctx.config, (rows_key,))
    if not per_table or rows % int(per_table):
        raise mixed_checkpoint(ctx.source.name, f"{rows_key} =", per_table, f"a hashed n-gram table of {rows} rows")
    return ctx.reader.row_mean(key) * (rows // int(per_table))
