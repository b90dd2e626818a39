"""What a checked GGUF header says about its model: the transformers config and the quantisation.

The config comes from the GGUF metadata through transformers' own GGUF mapping (`load_gguf_checkpoint(...,
return_tensors=False)`, which reads metadata only), then through the family's config class, exactly as
`AutoConfig.from_pretrained(folder, gguf_file=...)` builds it; so the dict equals `model.config.to_dict()` of the
model transformers loads from the file. Only called on a file whose header `gguf_format` has checked. Importing
transformers' GGUF module imports torch.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path

from posprobe.checkpoint.gguf_format import GGUFHeader, shown
from posprobe.errors import PosprobeError, first_line

GGUF_HINT = "convert the model with llama.cpp's convert_hf_to_gguf.py, or use its safetensors checkpoint"


def gguf_config(header: GGUFHeader, name: str) -> dict:
    """The config dict (as `PretrainedConfig.to_dict()` gives it) of the GGUF file `header.path`."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    arch = header.architecture
    try:
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
