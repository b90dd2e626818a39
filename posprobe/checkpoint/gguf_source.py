"""What a checked GGUF header says about its model: the transformers config and the quantisation.

The config comes from the GGUF metadata through transformers' own GGUF key table (`GGUF_CONFIG_MAPPING`), then
through the family's config class, exactly as `AutoConfig.from_pretrained(folder, gguf_file=...)` builds it; so the
dict equals `model.config.to_dict()` of the model transformers loads from the file. The metadata is the header
posprobe has already parsed and checked (`gguf_format`): transformers' own route (`load_gguf_checkpoint(...,
return_tensors=False)`) parses the whole file again with gguf's `GGUFReader`, one numpy view per vocabulary entry
(about 10 s for SmolLM2's 49,152 tokens and 48,900 merges on a loaded 2-core machine), before any argument can be
refused. That route is kept for the architectures transformers' loader special-cases (Mistral-named Llama files,
T5, MoE renames, StableLM, LFM2, gpt-oss, Gemma 4, MiniMax), and the two are tested equal on the others.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path

from posprobe.checkpoint.gguf_format import GGUFHeader, shown
from posprobe.errors import PosprobeError, first_line

GGUF_HINT = "convert the model with llama.cpp's convert_hf_to_gguf.py, or use its safetensors checkpoint"


def raw_config_from_header(header: GGUFHeader) -> dict | None:
    """The config keys transformers' GGUF loader reads from this file's metadata (`load_gguf_checkpoint(path,
    return_tensors=False)["config"]`), computed from the parsed header; None where the loader special-cases the
    architecture or does not support it (then ask it: `gguf_config` does)."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    from posprobe.architectures.table import (
        GGUF_LOADER_SPECIAL,
        GGUF_NAME_RENAMES,
        GGUF_RENAMED_MODEL_TYPES,
        GGUF_TIED_ANYWAY,
    )

    arch = header.metadata.get("general.architecture")
    name = str(header.metadata.get("general.name", ""))
    if not isinstance(arch, str) or arch not in GGUF_CONFIG_MAPPING:
        return None
    if any(special in arch for special in GGUF_LOADER_SPECIAL):
        return None
    if any(family in arch and word in name for family, word in GGUF_NAME_RENAMES):
        return None
    config: dict = {"tie_word_embeddings": "output.weight" not in header.tensors or arch in GGUF_TIED_ANYWAY}
    for key, value in (GGUF_CONFIG_DEFAULTS_MAPPING.get(arch) or {}).items():
        config.setdefault(key, value)
    for key, value in header.metadata.items():
        prefix, _, rest = key.partition(".")
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest) if rest else None
        if renamed is None or renamed == -1:
            continue
        if isinstance(value, list):
            if any(isinstance(item, list) for item in value):
                return None  # nested arrays: transformers' own parsing decides
            if len(value) == 1:  # a one-item array reads as its item, as in transformers' loader
                value = value[0]
        config[renamed] = value
    if config.get("model_type") in GGUF_RENAMED_MODEL_TYPES:
        config["model_type"] = GGUF_RENAMED_MODEL_TYPES[config["model_type"]]
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if "vocab_size" not in config and isinstance(tokens, list):
        config["vocab_size"] = len(tokens)
    return config


CACHE_ENV = "POSPROBE_CACHE_DIR"  # where GGUF configs are kept between runs; "off" keeps none


def config_cache_dir() -> Path | None:
    """`$POSPROBE_CACHE_DIR`, else `$XDG_CACHE_HOME/posprobe`, else `~/.cache/posprobe`; None when set to "off"."""
    import os

    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "none", "0") else Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "posprobe"


def _cache_file(header: GGUFHeader) -> Path | None:
    """The cache entry of this file's config: keyed by the file (resolved path, size, modification time) and the
    versions of transformers and posprobe that made it, so a changed file or library is never served an old one."""
    import hashlib
    from importlib import metadata

    folder = config_cache_dir()
    if folder is None:
        return None
    try:
        path = Path(header.path).resolve()
        stat = path.stat()
        versions = [metadata.version(d) for d in ("transformers", "posprobe")]
    except (OSError, metadata.PackageNotFoundError):
        return None
    key = json.dumps([str(path), stat.st_size, stat.st_mtime_ns, *versions])
    return folder / "gguf-config" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")


def _read_cached(entry: Path | None) -> dict | None:
    if entry is None:
        return None
    try:
        config = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _write_cached(entry: Path | None, config: dict) -> None:
    """Keep `config` for the next run (atomically: a temporary file renamed); a cache that cannot be written is
    skipped in silence — it only saves time."""
    import os
    import tempfile

    if entry is None:
        return
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=entry.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(config, fh)
            os.replace(tmp, entry)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except (OSError, TypeError, ValueError):
        return


def gguf_config(header: GGUFHeader, name: str) -> dict:
    """The config dict (as `PretrainedConfig.to_dict()` gives it) of the GGUF file `header.path`.

    Building it imports transformers' config classes, and with them torch (seconds); the dict is kept in a small
    cache (`config_cache_dir()`, keyed by the file and the library versions), so later commands on the same file
    start without either."""
    entry = _cache_file(header)
    cached = _read_cached(entry)
    if cached is not None:
        return cached | {"_name_or_path": str(Path(header.path))}
    config = _build_gguf_config(header, name)
    _write_cached(entry, config)
    return config


def _build_gguf_config(header: GGUFHeader, name: str) -> dict:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    arch = header.architecture
    try:
        raw = raw_config_from_header(header)
        if raw is None:
            from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

            with _quiet_transformers():  # it reports metadata it does not use, and config checks, as warnings
                raw = load_gguf_checkpoint(str(header.path), return_tensors=False)["config"]
    except Exception as err:  # ValueError for an unknown architecture; others for metadata it cannot map
        if "not supported" in str(err):
            raise PosprobeError(
                f"'{name}' is a GGUF file of architecture {shown(arch)}, which transformers cannot load",
                f"transformers reads GGUF files of: {', '.join(a for a in GGUF_CONFIG_MAPPING if a != 'general')}",
            ) from err
        raise PosprobeError(
            f"transformers cannot read the metadata of '{name}' (architecture {shown(arch)}): {first_line(err, 160)}",
            GGUF_HINT,
        ) from err
    model_type = raw.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise PosprobeError(
            f"'{name}' is a GGUF file of architecture {shown(arch)} (model type {model_type!r}), which this "
            "transformers version has no config class for",
            "upgrade transformers, or use the model's safetensors checkpoint",
        )
    try:
        with _quiet_transformers():
            config = CONFIG_MAPPING[model_type].from_dict(dict(raw)).to_dict()
    except Exception as err:  # config classes validate their fields with several exception types
        raise PosprobeError(
            f"the GGUF metadata of '{name}' gives a config transformers refuses: {first_line(err, 160)}", GGUF_HINT
        ) from err
    config["_name_or_path"] = str(Path(header.path))
    return config


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' logging at error level only, restored afterwards."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


def check_block_count(header: GGUFHeader, config: dict, name: str) -> None:
    """The layer count the metadata gives (`<arch>.block_count`, in the config) must be the number of `blk.N`
    layers whose tensors the file holds: a larger one (2**31 from a crafted file) had transformers build billions
    of layers, a smaller one silently analysed part of the model."""
    key = next((k for k in ("num_hidden_layers", "n_layer", "n_layers") if k in config), None)
    stored = {
        int(parts[1])
        for parts in (t.split(".") for t in header.tensors)
        if parts[0] == "blk" and parts[1:2] and parts[1].isdigit()
    }
    if key is None or not stored:
        return
    count = config[key]
    if stored != set(range(len(stored))) or count != len(stored):
        held = f"layers 0..{max(stored)}" if stored == set(range(len(stored))) else f"{len(stored)} layers"
        field = f"{shown(header.architecture)[1:-1]}.block_count"
        says = f"gives {field} = {count}" if field in header.metadata else f"lacks {field} (read as {count})"
        raise PosprobeError(
            f"the GGUF metadata of '{name}' {says}, but the file holds the tensors of {held}", GGUF_HINT
        )


def is_attention_weight(gguf_name: str) -> bool:
    """A Q/K/V/output projection of attention in llama.cpp's tensor names (`blk.N.attn_q.weight`, `attn_qkv`, ...;
    not `attn_norm`)."""
    parts = gguf_name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2].startswith("attn_") and "norm" not in parts[-2]


def quantization(header: GGUFHeader) -> str | None:
    """The ggml type of most attention projection weights ('Q4_1', 'Q8_0', 'F16', ...): what the analysed Q/K
    were de-quantised from. Where the file has no recognisable attention weights, the most common type of its
    matrices; None for a file without tensors."""
    attention = Counter(t.type_name for t in header.tensors.values() if is_attention_weight(t.name))
    counts = attention or Counter(t.type_name for t in header.tensors.values() if len(t.shape) >= 2)
    counts = counts or Counter(t.type_name for t in header.tensors.values())
    return counts.most_common(1)[0][0] if counts else None
