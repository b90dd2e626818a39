"""`posprobe.load_model`: a torch model from any checkpoint posprobe reads, a retrofitted one with its mechanism.

The plain model is built by `posprobe.checkpoint.loading.build_model` (checks before, quiet while transformers
loads, finite after; safetensors, pickle when allowed, GGUF through `gguf_file=`). A checkpoint saved by
`save_retrofitted` (config.json has a `posprobe` recipe) then gets its mechanism re-installed through
`posprobe.retrofitting.install` and the mechanism weights (and their initial values) read back, so outputs match the
saved model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posprobe.errors import ArgumentError, ArgumentTypeError, ArgumentValueError, PosprobeError
from posprobe.mechanisms import REGISTRY
from posprobe.mechanisms.catalogue import mechanism_info
from posprobe.retrofitting.install import CONFIG_KEY, INITIAL_FILE, _family, _install


def load_model(
    path_or_id: str | Path | None = None,
    model_class: Any = None,
    *,
    allow_pickle: bool = False,
    verbose: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """Load a plain or a retrofitted checkpoint: a hub id, a folder, a .gguf file (or a folder holding one), a
    packaged name ('SmolLM2-135M-Instruct'), None (the packaged all-MiniLM-L6-v2), or the `ModelSource` of one.

    model_class: a transformers auto/task class (default `AutoModel`), e.g. `AutoModelForSequenceClassification`;
    extra `kwargs` go to its `from_pretrained`. A retrofitted checkpoint (config.json has a `posprobe` key) gets
    its mechanism rebuilt and its mechanism weights loaded from the safetensors, so outputs match the saved model.
    A GGUF file is built by transformers (`gguf_file=`), every tensor de-quantised to float32.
    allow_pickle: also accept `pytorch_model.bin` (read with torch's weights-only unpickler; never runs code).
    verbose: let transformers' logging, progress bars and warnings through (quiet by default).

    Checked before transformers builds the model: the config (types, sizes, a model_type transformers knows)
    and every safetensors or GGUF header; after: all parameters finite. Each failure is one `PosprobeError`.
    """
    from posprobe.checkpoint import ModelSource, resolve_model
    from posprobe.checkpoint.loading import build_model, check_before_load
    from posprobe.validation import as_bool

    if path_or_id is not None and not isinstance(path_or_id, (str, os.PathLike, ModelSource)):
        raise ArgumentTypeError(
            "path_or_id",
            f"{{arg}} must be a hub id or a folder path (str or Path), got {type(path_or_id).__name__} {path_or_id!r}",
            "pass e.g. 'bert-base-uncased', a folder written by `save_pretrained`, a .gguf file, or None for the "
            "packaged model",
        )
    allow_pickle, verbose = as_bool(allow_pickle, "allow_pickle"), as_bool(verbose, "verbose")
    if kwargs.get("trust_remote_code"):
        raise ArgumentValueError(
            "trust_remote_code", "posprobe never runs code shipped with a checkpoint", "drop {arg}"
        )
    if kwargs.get("output_loading_info"):
        raise ArgumentValueError(
            "output_loading_info", "load_model returns the model only", "drop {arg}; verbose=True shows the load report"
        )
    if model_class is not None and not callable(getattr(model_class, "from_pretrained", None)):
        raise ArgumentTypeError(
            "model_class",
            f"{{arg}} must be a transformers model class with from_pretrained, got {model_class!r}",
            "e.g. transformers.AutoModelForSequenceClassification",
        )
    if not isinstance(path_or_id, ModelSource):  # a ModelSource: resolved once already, by the command
        path_or_id = None if path_or_id is None else os.fspath(path_or_id)
    source = resolve_model(path_or_id, allow_pickle=allow_pickle, with_tokenizer=True)
    check_before_load(source)
    spec = source.config.get(CONFIG_KEY)
    if spec:
        _check_recipe(spec, source)
    model = build_model(source, model_class, verbose=verbose, **kwargs)
    if not spec:
        return model
    _family(model)
    slots = _install(model, spec)
    for module, slot in slots:
        module.posprobe_mechanisms[slot].reset("zero")
    _load_mechanism_weights(model, source.path)
    setattr(model.config, CONFIG_KEY, dict(spec))
    model._posprobe_initial = _read_initial(source.path)
    return model


def _read_initial(folder: Path) -> dict[str, torch.Tensor] | None:
    """`INITIAL_FILE` of a retrofitted folder (None when absent: written before posprobe stored it)."""
    from safetensors.torch import load_file

    path = Path(folder) / INITIAL_FILE
    if not path.is_file():
        return None
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises its own error types for corrupt files
        raise PosprobeError(
            f"cannot read the initial mechanism values '{path}' ({type(err).__name__}: {err})",
            f"delete {INITIAL_FILE} (the change from init is then unknown) or re-run `posprobe retrofit`",
        ) from err


def _known_mechanism(name) -> bool:
    """A registered mechanism or a combination of them."""
    if name in REGISTRY:
        return True
    try:
        return isinstance(name, str) and "+" in name and mechanism_info(name) is not None
    except ArgumentError:
        return False


def _check_recipe(spec: dict, source) -> None:
    """The `posprobe` entry of a retrofitted checkpoint's config.json names a known mechanism (checked before
    the model is loaded)."""
    if source.weight_format != "safetensors":
        raise PosprobeError(
            f"retrofitted checkpoint '{source.name}' has no safetensors weights",
            "re-save it with `posprobe retrofit` / save_retrofitted",
        )
    mechanism = spec.get("mechanism")
    if not isinstance(mechanism, str) or not _known_mechanism(mechanism):
        raise PosprobeError(
            f"checkpoint '{source.name}' uses unknown mechanism {mechanism!r}", f"known: {', '.join(sorted(REGISTRY))}"
        )
    # radius / kernels are checked where the recipe is installed (_install, through the catalogue)
    if not isinstance(spec.get("drop_position_embeddings", False), bool):
        raise PosprobeError(
            f"config.json of '{source.name}' has a non-boolean posprobe.drop_position_embeddings",
            "re-run `posprobe retrofit`",
        )


def _load_mechanism_weights(model: nn.Module, folder: Path) -> None:
    """Copy the mechanism tensors from the folder's safetensors (read and checked by posprobe's own reader)."""
    from posprobe.checkpoint.weights import WeightReader

    prefix = getattr(model, "base_model_prefix", "")

    def strip(name: str) -> str:
        return name[len(prefix) + 1 :] if prefix and name.startswith(prefix + ".") else name

    wanted = {strip(n): p for n, p in model.named_parameters() if ".posprobe_mechanisms." in f".{n}"}
    found: set[str] = set()
    reader = WeightReader(Path(folder), "safetensors")
    for key in reader.keys():
        name = strip(key)
        if name in wanted:
            param = wanted[name]
            tensor = torch.from_numpy(reader.get(key))  # float64, finite; exact for every stored float dtype
            if tuple(tensor.shape) != tuple(param.shape):
                raise PosprobeError(
                    f"mechanism tensor '{key}' has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}",
                    "the checkpoint does not match its config",
                )
            with torch.no_grad():
                param.copy_(tensor.to(param.dtype))
            found.add(name)
    missing = sorted(set(wanted) - found)
    if missing:
        raise PosprobeError(
            f"retrofitted checkpoint in '{folder}' lacks {len(missing)} mechanism tensors (e.g. '{missing[0]}')",
            "the weights file is incomplete; re-run `posprobe retrofit`",
        )
