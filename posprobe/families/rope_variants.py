"""Rotary scaling variants of SPEC §17 (`none`, `linear:F`, `dynamic:F`, `yarn:F`, `llama3:F`), applied through
transformers' own rope initialisation: a variant is a copy of the model's config with new `rope_parameters`, and
the model's rotary module is rebuilt from it (its class's own `__init__`, which calls `ROPE_INIT_FUNCTIONS`); no
frequency is derived here. Also the trained length of a config and its base rotary setting (for the budget).

Configs with one rotary setting per layer type (Gemma 3: sliding / full attention) get the variant on their
full-attention setting only: the sliding layers never see farther than their window. Configs keyed by rope type
(DeepSeek V4: 'main', 'compress') get it on the setting of the layers other than sliding ones.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from posprobe.errors import ArgumentValueError, PosprobeError

SCALING_TYPES = ("linear", "dynamic", "yarn", "llama3", "longrope")
NONE = "none"
# transformers requires these for llama3 and has no default: the values of Llama 3.1's release.
LLAMA3_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
FULL_ATTENTION = "full_attention"
MAX_FACTOR = 1e6  # a context a million times the trained one: past it (1e308) wavelengths and scales overflow


@dataclass(frozen=True)
class RopeVariant:
    """One variant: `name` as given ('none', 'yarn:4'), `rope_type` (None for the model unchanged), `factor`."""

    name: str
    rope_type: str | None = None
    factor: float | None = None


def parse_variants(spec: str | Sequence[str] | None) -> list[RopeVariant]:
    """'none,linear:2,yarn:4' (or a list of such names) -> variants in the order given, duplicates dropped.
    Refused in one line: an unknown type, a missing or non-numeric factor, a factor outside 1..`MAX_FACTOR`,
    longrope."""
    items = spec.split(",") if isinstance(spec, str) else list(spec or [NONE])
    variants: dict[str, RopeVariant] = {}
    for raw in items:
        item = str(raw).strip().lower()
        if not item:
            continue
        if item == NONE:
            variants[NONE] = RopeVariant(NONE)
            continue
        kind, _, value = item.partition(":")
        if kind == "longrope":
            raise ArgumentValueError(
                "rope_scaling",
                "{arg} longrope needs the per-pair short_factor / long_factor lists found by LongRoPE's search, "
                "which no factor alone gives",
                "measure a checkpoint whose config carries them (variant 'none'), or use linear, dynamic, yarn, llama3",
            )
        if kind not in SCALING_TYPES:
            raise ArgumentValueError(
                "rope_scaling",
                f"{{arg}} '{raw}' is not a variant",
                "use none or TYPE:FACTOR with TYPE one of linear, dynamic, yarn, llama3 (e.g. none,linear:2,yarn:4)",
            )
        try:
            factor = float(value)
        except ValueError:
            factor = float("nan")
        if not math.isfinite(factor) or not 1 <= factor <= MAX_FACTOR:
            raise ArgumentValueError(
                "rope_scaling",
                f"{{arg}} '{raw}' needs a factor from 1 to {MAX_FACTOR:g}",
                f"e.g. {kind}:2 (a number after the colon; past {MAX_FACTOR:g} the wavelengths leave float range)",
            )
        name = f"{kind}:{factor:g}"
        variants[name] = RopeVariant(name, kind, factor)
    if not variants:
        raise ArgumentValueError("rope_scaling", "{arg} names no variant", "e.g. none,linear:2,yarn:4")
    return list(variants.values())


def _nested(parameters) -> bool:
    """True for rope parameters given per layer type ({'full_attention': {...}, 'sliding_attention': {...}})."""
    return isinstance(parameters, dict) and bool(parameters) and all(isinstance(v, dict) for v in parameters.values())


def base_parameters(config) -> dict:
    """The rotary setting the variants change (a transformers config): `rope_parameters`, or where it has one per
    layer type (or rope type) the entry `variant_key` names."""
    config.standardize_rope_params()
    parameters = config.rope_parameters
    if _nested(parameters):
        return parameters[variant_key(config)]
    return parameters


def max_positions(config) -> int | None:
    """`max_position_embeddings` (or GPT-2's `n_positions`) of a transformers config, None when it has neither."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def trained_length(config, rotary: bool = True) -> int | None:
    """The length the model was trained on (SPEC §17): `original_max_position_embeddings` of its rope parameters
    (or of the config: Phi-3) where set, else `max_position_embeddings`."""
    if rotary:
        original = getattr(config, "original_max_position_embeddings", None)
        if original is None:
            parameters = getattr(config, "rope_parameters", None) or {}
            parameters = base_parameters(config) if parameters else {}
            original = parameters.get("original_max_position_embeddings")
        if isinstance(original, int) and original > 0:
            return original
    return max_positions(config)


def variant_parameters(config, variant: RopeVariant) -> dict:
    """The rope parameters of `variant` (SPEC §17): {rope_type, factor, rope_theta: the model's,
    original_max_position_embeddings: the model's max_position_embeddings} plus transformers' defaults (llama3:
    `LLAMA3_DEFAULTS`); the partial rotary factor is kept."""
    base = base_parameters(config)
    parameters = {
        "rope_type": variant.rope_type,
        "factor": float(variant.factor),
        "rope_theta": base["rope_theta"],
        "original_max_position_embeddings": max_positions(config),
    }
    if base.get("partial_rotary_factor") is not None:
        parameters["partial_rotary_factor"] = base["partial_rotary_factor"]
    if variant.rope_type == "llama3":
        parameters.update(LLAMA3_DEFAULTS)
    return parameters


def variant_config(config, variant: RopeVariant):
    """A deep copy of the transformers config `config` with the variant's rope parameters (the model's own for
    'none'); `max_position_embeddings` left as it is."""
    config = copy.deepcopy(config)
    if variant.rope_type is None:
        return config
    config.standardize_rope_params()
    parameters = variant_parameters(config, variant)
    if _nested(config.rope_parameters):
        config.rope_parameters = {**config.rope_parameters, variant_key(config): parameters}
    else:
        config.rope_parameters = parameters
    return config


def variant_key(config) -> str | None:
    """The key of the rotary setting a variant changes (None when the config has one setting): the full-attention
    layers' ('full_attention'; where the family keys its settings by rope type, `Family.tensors['rope_types']`, the
    key its layers other than sliding ones read: DeepSeek V4's 'compress', the YaRN rope of its compressed layers,
    not its sliding layers' 'main'), else the first."""
    parameters = config.rope_parameters
    if not _nested(parameters):
        return None
    if FULL_ATTENTION in parameters:
        return FULL_ATTENTION
    from posprobe.architectures.table import family_for_type

    family = family_for_type(str(getattr(config, "model_type", "")))
    rule = family.tensors.get("rope_types") if family is not None else None
    if rule:
        keys = dict(pair.split(":") for pair in rule.split(","))
        key = keys.get(FULL_ATTENTION, keys.get("*"))
        if key in parameters:
            return key
    return next(iter(parameters))


def rotary_modules(model) -> list[tuple[object, str, object]]:
    """(parent, attribute, module) of every transformers rotary module of `model` (it holds an `inv_freq`
    buffer, its config and a `rope_type`)."""
    found = []
    for parent in model.modules():
        for attribute, child in parent.named_children():
            inv = [name for name, _ in child.named_buffers(recurse=False) if name.endswith("inv_freq")]
            if inv and hasattr(child, "rope_type") and hasattr(child, "config"):
                found.append((parent, attribute, child))
    return found


def require_rotary_module(model, name: str) -> None:
    """Refuse a rotary model whose rotary module posprobe cannot rebuild for a variant."""
    if not rotary_modules(model):
        raise PosprobeError(
            f"'{name}' has no transformers rotary module (with rope_type and inv_freq) to rebuild for a variant",
            "use --rope-scaling none for this model",
        )


def inv_freq_of(module, layer_type: str | None) -> tuple:
    """(inv_freq (F,) torch float, attention scaling) of a rotary module, for `layer_type` where it keeps one
    setting per layer type."""
    prefix = "" if layer_type is None else f"{layer_type}_"
    scaling = getattr(module, "attention_scaling", 1.0)
    if isinstance(scaling, dict):
        scaling = scaling.get(layer_type, 1.0)
    return getattr(module, f"{prefix}inv_freq"), float(scaling)


@contextmanager
def applied(model, variant: RopeVariant) -> Iterator[list]:
    """Inside the block, every rotary module of `model` is one built by its own class from the variant's config
    (transformers' rope initialisation); the original modules are put back after, even on error. Yields the
    list of modules in use (the originals for 'none')."""
    found = rotary_modules(model)
    if variant.rope_type is None:
        yield [module for _, _, module in found]
        return
    built = []
    try:
        for parent, attribute, module in found:
            buffer = next(b for n, b in module.named_buffers(recurse=False) if n.endswith("inv_freq"))
            new = type(module)(config=variant_config(module.config, variant)).to(buffer.device)
            setattr(parent, attribute, new)
            built.append(new)
        yield built
    finally:
        for parent, attribute, module in found:
            setattr(parent, attribute, module)
