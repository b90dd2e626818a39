"""Checked reads of config.json: every field posprobe (or the model class it builds) relies on has the right type.

`validate_config` runs once when a checkpoint is resolved, so every command refuses a malformed config with one
line before any weights are read or any model is built. `config_int` / `config_float` are the accessors the
rest of posprobe uses, so a field of the wrong type is a clean `PosprobeError`, never a TypeError.

A model's sizes are read here too, under whatever names its family uses (`table.CONFIG_KEYS`): `Shape` (heads, key
heads, head size, widths, layers, norm epsilon, position limit, vocabulary), `config_size`, the reserved leading rows
of a position table (`reserved_rows`) and the error for a config.json that disagrees with the weights beside it
(`mixed_checkpoint`). The one module below both `checkpoint` and `families` that reads config.json.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

from posprobe.architectures import table as T
from posprobe.architectures.table import FAMILIES, config_default, model_types
from posprobe.errors import PosprobeError

# Families whose config fields posprobe reads (analyses) or relies on (retrofit): checked in depth.
CHECKED_FAMILIES = model_types(analysable=True)
_HINT = "fix config.json or re-save the checkpoint with `save_pretrained`"
_GGUF_HINT = "convert the model again with llama.cpp's convert_hf_to_gguf.py, or use its safetensors checkpoint"
# Sizes: whole numbers >= 1 wherever they appear (under any family's name for them).
_SIZES = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "max_position_embeddings",
    "num_hidden_groups",
    "inner_group_num",
    "n_positions",
    "n_ctx",
    "n_embd",
    "n_head",
    "n_layer",
    "dim",
    "n_heads",
    "n_layers",
    "hidden_dim",
)
_COUNTS = ("type_vocab_size",)  # may be 0 (DeBERTa-v2 has no token types)
# GPT-2 / GPT-Neo: null means 4 * hidden; Llama-like: null key/value heads or head size mean the defaults
_NULLABLE_SIZES = ("n_inner", "embedding_size", "intermediate_size", "num_key_value_heads", "head_dim")
_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id")
_EPSILONS = ("layer_norm_eps", "layer_norm_epsilon")
_PROBABILITIES = (
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "classifier_dropout",
    "classifier_dropout_prob",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "summary_first_dropout",
    "dropout",
    "attention_dropout",
    "seq_classif_dropout",
)
# model types whose position ids start at pad_token_id + 1
_RESERVED_ROWS = tuple(t for f in FAMILIES if f.reserved_rows is True for t in f.model_types)
# (heads, width) field pairs whose ratio is the head size.
_HEAD_PAIRS = (("num_attention_heads", "hidden_size"), ("n_head", "n_embd"), ("n_heads", "dim"))


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_gguf(name: str) -> bool:
    return str(name).lower().endswith(".gguf")


def config_where(name: str) -> str:
    """Where the config of checkpoint `name` came from, for a message: config.json, or the metadata of a GGUF
    file (which transformers maps to a config)."""
    return f"the GGUF metadata of '{name}'" if _is_gguf(name) else f"config.json of '{name}'"


def config_hint(name: str, default: str = _HINT) -> str:
    """What to do about a bad config of `name`: `default` for a folder, re-converting for a GGUF file."""
    return _GGUF_HINT if _is_gguf(name) else default


def config_int(config: dict, name: str, *keys: str, default=None, minimum: int | None = 1, nullable: bool = False):
    """The first of `keys` present in `config` as an int >= `minimum` (`default` if none is present; None
    accepted when `nullable`). `name` names the checkpoint in the error."""
    for key in keys:
        if key in config:
            value = config[key]
            if value is None and nullable:
                return None
            if not _whole(value) or (minimum is not None and value < minimum):
                need = "a whole number" + (f" >= {minimum}" if minimum is not None else "")
                if nullable:
                    need += " or null"
                raise PosprobeError(f"{config_where(name)} has {key} = {value!r}, expected {need}", config_hint(name))
            return value
    if default is None and not nullable:
        raise PosprobeError(f"{config_where(name)} lacks {' / '.join(keys)}", config_hint(name))
    return default


def config_float(config: dict, name: str, *keys: str, default=None, positive: bool = False, maximum=None):
    """The first of `keys` present as a finite float (`positive`: > 0; `maximum`: <= it); else `default`."""
    for key in keys:
        if key in config:
            value = config[key]
            ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and (not positive or value > 0) and (maximum is None or value <= maximum)
            if not ok:
                need = "a positive number" if positive else "a number"
                need += f" <= {maximum:g}" if maximum is not None else ""
                raise PosprobeError(f"{config_where(name)} has {key} = {value!r}, expected {need}", config_hint(name))
            return float(value)
    if default is None:
        raise PosprobeError(f"{config_where(name)} lacks {' / '.join(keys)}", config_hint(name))
    return default


def validate_config(config, name: str) -> dict:
    """Check a parsed config.json; returns it unchanged.

    Every config: a JSON object with a `model_type` that is a name (if any), string/list-typed fields of the
    right type. Configs of the families posprobe reads or retrofits (`CHECKED_FAMILIES`) also get their
    sizes, token ids, epsilons and dropout rates checked; other families use these names differently (lists
    of per-stage heads, floats) and are left to transformers, whose errors `load_model` maps to one line.
    """
    if not isinstance(config, dict):
        raise PosprobeError(f"{config_where(name)} is not a JSON object", config_hint(name))
    model_type = config.get("model_type")
    if model_type is not None and (not isinstance(model_type, str) or not model_type):
        raise PosprobeError(f"{config_where(name)} has model_type = {model_type!r}, expected a name", config_hint(name))
    _check_names(config, name)
    check_rope_types(config, name)
    if model_type in CHECKED_FAMILIES:
        _check_sizes(config, name, model_type)
    return config


def refuse_unlisted_type(config: dict, name: str) -> None:
    """One line for a config whose `model_type` the family table does not list (a type a newer transformers added, a
    custom one): it names the type, the transformers release the table answers for and, where it differs, the one
    installed. A config without a `model_type` is left to transformers."""
    model_type = config.get("model_type")
    if model_type is None or T.family_for_type(model_type) is not None:
        return
    raise unlisted_type_error(name, str(model_type))


def unlisted_type_error(name: str, model_type: str) -> PosprobeError:
    """The refusal of a model type the family table does not list (see `refuse_unlisted_type`)."""
    from importlib.metadata import PackageNotFoundError, version

    from posprobe.version import TESTED_TRANSFORMERS, __version__

    try:
        installed = version("transformers")
    except PackageNotFoundError:
        installed = None
    covered = f"posprobe {__version__} reads the model types of transformers {TESTED_TRANSFORMERS}"
    covered += ", the release it is tested with"
    if installed and installed != TESTED_TRANSFORMERS:
        covered += f"; yours is {installed}, which may have added '{model_type}'"
    return PosprobeError(
        f"'{name}' has model type '{model_type}', which posprobe's family table does not list ({covered})",
        "use a model of a listed type (the table of families: docs/families.md)"
        + (f", or install transformers=={TESTED_TRANSFORMERS}" if installed != TESTED_TRANSFORMERS else ""),
    )


def _check_sizes(config: dict, name: str, model_type: str) -> None:
    for key in _SIZES:
        config_int(config, name, key, default=0)
    for key in _COUNTS:
        config_int(config, name, key, default=0, minimum=0)
    for key in _NULLABLE_SIZES:
        if key == "intermediate_size" and isinstance(config.get(key), list):  # one per layer (Gemma 3n)
            for item in config[key]:
                config_int({key: item}, name, key)
        else:
            config_int(config, name, key, nullable=True)
    for key in _TOKEN_IDS:  # some configs use -1 for "none" (old LLaMA): any whole number or null
        value = config.get(key)
        if isinstance(value, list) and key == "eos_token_id":  # generation configs may list several
            for item in value:
                config_int({key: item}, name, key, minimum=None)
        else:
            config_int(config, name, key, minimum=None, nullable=True)
    for key in _EPSILONS:
        config_float(config, name, key, default=0.0, positive=True)
    _check_rope(config, name)
    for key in _PROBABILITIES:
        if config.get(key) is not None:
            config_float(config, name, key, default=0.0, maximum=1.0)
            if config[key] < 0:
                raise PosprobeError(
                    f"{config_where(name)} has {key} = {config[key]!r}, expected 0..1", config_hint(name)
                )
    for heads, width in _HEAD_PAIRS:
        if heads in config and width in config and "head_dim" not in config and config[width] % config[heads]:
            raise PosprobeError(
                f"{config_where(name)} has {width} = {config[width]} not divisible by {heads} = {config[heads]}",
                config_hint(name),
            )
    reserved_pad = config.get("pad_token_id", 1)
    if model_type in _RESERVED_ROWS and (reserved_pad is None or reserved_pad < 0):
        raise PosprobeError(
            f"{config_where(name)} has pad_token_id = {reserved_pad!r}, but a {model_type} model reserves "
            "pad_token_id + 1 leading rows of its position table (and needs it to number positions)",
            "set pad_token_id in config.json (1 for RoBERTa, XLM-R and CamemBERT)",
        )
    vocab, pad = config.get("vocab_size"), config.get("pad_token_id")
    family = T.family_for_type(model_type)
    if family is not None and "codebook_words" in family.tensors and _whole(vocab):
        vocab += 1  # MusicGen: each codebook table holds vocab_size + 1 rows, its padding id is vocab_size
    if _whole(vocab) and _whole(pad) and not -vocab <= pad < vocab:
        raise PosprobeError(
            f"{config_where(name)} has pad_token_id = {pad} outside the vocabulary of {vocab}", config_hint(name)
        )


def _check_rope(config: dict, name: str) -> None:
    """The rotary base (`rope_theta`, top level or in transformers 5's `rope_parameters`) is a positive finite
    number, and a partial rotary factor lies in (0, 1]: 0, a negative, NaN or a string gave NaN frequencies or a
    ZeroDivisionError where the model is built."""
    for where in (config, config.get("rope_parameters")):
        if isinstance(where, dict):
            if where.get("rope_theta") is not None:
                config_float(where, name, "rope_theta", positive=True)
            if where.get("partial_rotary_factor") is not None:
                config_float(where, name, "partial_rotary_factor", positive=True, maximum=1.0)
            if where.get("factor") is not None:
                config_float(where, name, "factor", positive=True)


# rope types transformers' config classes rename to one of their own before validating (Phi-3's 'su', Qwen2-VL's
# 'mrope', HunYuan-VL's 'xdrope'); the rest are the types with a validation function (`known_rope_types`)
_ROPE_ALIASES = ("su", "mrope", "xdrope")


def known_rope_types() -> tuple[str, ...]:
    """The rope types transformers builds a rotary module for: those its `RotaryEmbeddingConfigMixin` validates
    ('default', 'linear', 'dynamic', 'yarn', 'longrope', 'llama3', ...), and the aliases its config classes rename."""
    from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin

    prefix, suffix = "_validate_", "_rope_parameters"
    methods = [n for n in dir(RotaryEmbeddingConfigMixin) if n.startswith(prefix) and n.endswith(suffix)]
    return tuple(sorted({n[len(prefix) : -len(suffix)] for n in methods} | set(_ROPE_ALIASES)))


def check_rope_types(config: dict, name: str) -> None:
    """Every rope type the config names (`rope_scaling` / `rope_parameters`, flat or one entry per layer type, in
    the config or its `text_config`) is one transformers knows (`known_rope_types`): an unknown one ('warp9') made
    transformers log "Missing validation function" and fail with a KeyError where the rotary module is built."""
    for where in (config, config.get("text_config")):
        if not isinstance(where, dict):
            continue
        for key in ("rope_scaling", "rope_parameters"):
            settings = where.get(key)
            if not isinstance(settings, dict):
                continue
            nested = [v for v in settings.values() if isinstance(v, dict)]
            for entry in nested if nested and not ({"rope_type", "type"} & set(settings)) else [settings]:
                kind = entry.get("rope_type", entry.get("type"))
                if kind is None or kind == "default":
                    continue
                known = known_rope_types()
                if kind not in known:
                    raise PosprobeError(
                        f"{config_where(name)} has {key} with rope_type {kind!r}, which transformers does not know "
                        f"(known: {', '.join(known)})",
                        config_hint(name, "set rope_type in config.json to one of these"),
                    )


def _check_names(config: dict, name: str) -> None:
    for key in ("position_embedding_type", "_name_or_path"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise PosprobeError(
                f"{config_where(name)} has {key} = {config[key]!r}, expected a string", config_hint(name)
            )
    architectures = config.get("architectures")
    if architectures is not None and not (
        isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)
    ):
        raise PosprobeError(
            f"{config_where(name)} has architectures = {architectures!r}, expected a list of names", config_hint(name)
        )
    recipe = config.get("posprobe")
    if recipe is not None and not isinstance(recipe, dict):
        raise PosprobeError(f"{config_where(name)} has a 'posprobe' entry that is not an object", config_hint(name))


CONFIG_HINT = _HINT
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
    a model's sizes are read and checked (those of the stack the family reads: `table.stack_sizes`)."""
    config = T.stack_sizes(family, config)
    heads = config_size(config, name, "heads")
    hidden = config_size(config, name, "hidden")
    kv_heads = T.qkv_layout(family, config)[1] or config_size(config, name, "kv_heads", default=heads)
    width = config_size(config, name, "attention_width", default=hidden)  # MobileBERT's bottleneck width
    head_dim = config_size(config, name, "head_dim", default=width // heads)
    if family.head_ratio:  # mixed attention (ConvBERT): H' softmax heads of d / (2 H') each
        heads = kv_heads = T.softmax_heads(family, config, heads)
        head_dim = width // heads // 2
    if T.config_value(config, "head_dim") is None and width % heads:
        raise PosprobeError(
            f"{config_where(name)} has hidden size {width} not divisible by {heads} heads",
            config_hint(name, "the config is malformed; re-save the checkpoint"),
        )
    if family.tensors.get("query_heads_per_layer"):  # Laguna: H = the most query heads of any layer (SPEC §9)
        heads = max(query_heads_per_layer(config, name, family, kv_heads) or [heads])
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
    types = config.get("layer_types")
    if family.tensors.get("mlp_layer_entries") and isinstance(types, list) and "mlp" in types:
        layers = len(types) - types.count("mlp")  # Dory's config.json lists each layer's attention and mlp apart
    if family.sublayers > 1:  # LongCat-Flash: num_layers stored layers, each with `sublayers` attention sublayers
        layers = config_int(config, name, "num_layers") * family.sublayers
    if "loop" in family.tensors:  # Inkling 2 Loop: stored layers start..end-1 run `passes` times, each a depth
        start, end, passes = (config_int(config, name, key, minimum=0) for key in family.tensors["loop"].split(","))
        layers += (passes - 1) * (end - start)
    if family.shared_layers and config_int(config, name, "num_hidden_groups", default=1) != 1:
        raise PosprobeError(
            f"'{name}' is an ALBERT with {config.get('num_hidden_groups')} layer groups",
            "posprobe analyses ALBERT checkpoints with one shared layer group (all released ones)",
        )
    if family.qkv == T.LATENT:  # MLA: each head's q and k hold the rotary and the position-free part
        head_dim = config_size(config, name, "latent_head_dim") + config_size(config, name, "latent_rope_dim")
        kv_heads = heads  # every head has its own key (one shared rotary part, its own position-free part)
    if family.qkv == T.ROUTED_QUERY:  # JetMoE: query head h reads key head h mod H_kv, given per query head
        kv_heads = heads
    return Shape(heads, kv_heads, head_dim, hidden, layers, float(eps), positions, vocab)


def query_heads_per_layer(config: dict, name: str, family: T.Family, kv_heads: int) -> list[int] | None:
    """Each layer's query-head count where the config lists one per layer (`Family.tensors['query_heads_per_layer']`,
    Laguna's num_attention_heads_per_layer), else None; checked: whole numbers >= 1, multiples of the key heads."""
    key = family.tensors.get("query_heads_per_layer")
    counts = config.get(key) if key else None
    if counts is None:
        return None
    if not isinstance(counts, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in counts):
        raise PosprobeError(f"{config_where(name)} has {key} = {counts!r}, expected a list of whole numbers",
                            config_hint(name))  # fmt: skip
    if any(h < 1 or h % kv_heads for h in counts):
        raise PosprobeError(
            f"{config_where(name)} has {key} = {counts}, not all multiples of {kv_heads} key/value heads",
            config_hint(name, "the config is malformed; re-save the checkpoint"),
        )
    return counts


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
