"""Checks around building a torch model from a checkpoint with transformers (used by `posprobe.load_model`).

Before transformers touches the folder: config.json names a model type transformers knows, and every
safetensors file passes posprobe's own header check (so a damaged file is one clear line, not a
SafetensorError). While it loads: transformers' logging, progress bars and Python warnings are silenced
unless `verbose`. After: every parameter is finite. Whatever the libraries still raise becomes one
`PosprobeError`.
"""

from __future__ import annotations

import contextlib
import pickle
import warnings

from posprobe.checkpoint.resolve import ModelSource
from posprobe.checkpoint.weights import unpickling_refused
from posprobe.errors import PosprobeError, first_line

_LOAD_HINT = "the checkpoint does not match what transformers expects; re-save it with `save_pretrained`"


def check_before_load(source: ModelSource) -> None:
    """Refuse a checkpoint transformers would fail on (or warn about) before it builds anything."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = source.config.get("model_type")
    if model_type is None:
        raise PosprobeError(
            f"config.json of '{source.name}' has no model_type", "add it: transformers' name of the family, e.g. bert"
        )
    if model_type not in CONFIG_MAPPING_NAMES:
        raise PosprobeError(
            f"config.json of '{source.name}' has model_type '{model_type}', which this transformers version "
            "does not know",
            "check the spelling, or upgrade transformers if the architecture is new",
        )
    if source.weight_format == "safetensors":
        from posprobe.checkpoint.safetensors_format import read_header
        from posprobe.checkpoint.weights import WeightReader

        WeightReader(source.path, "safetensors")  # the files transformers will read, and the index, checked
        for file in sorted(source.path.glob("*.safetensors")):  # and any other it might pick instead
            read_header(file)


@contextlib.contextmanager
def quiet_libraries(verbose: bool = False):
    """Silence transformers' and huggingface_hub's logging and progress bars and Python warnings (unless
    `verbose`); the previous settings are restored afterwards."""
    if verbose:
        yield
        return
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hub_bars_off = are_progress_bars_disabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if not hub_bars_off:
            enable_progress_bars()


def load_failure(source: ModelSource, err: Exception) -> PosprobeError:
    """One line for whatever a library raised while building the model from `source`."""
    if isinstance(err, PosprobeError):
        return err
    if isinstance(err, pickle.UnpicklingError) or "weights_only" in str(err) or "Weights only" in str(err):
        return unpickling_refused(source.name, err)
    text = str(err)
    if "ignore_mismatched_sizes" in text or "size mismatch" in text:
        return PosprobeError(
            f"cannot load '{source.name}': some tensors in its weights have other shapes than config.json implies",
            "the weights and config.json come from different models; re-save the checkpoint "
            "(load_model(..., verbose=True) shows transformers' report)",
        )
    detail = first_line(err)
    what = type(err).__name__ + (f": {detail}" if detail != type(err).__name__ else "")
    return PosprobeError(f"cannot load '{source.name}': {what}", _LOAD_HINT)


def check_finite(model, name: str) -> None:
    """Refuse a model with NaN or infinite parameters (it would train and score as if nothing were wrong)."""
    import torch

    for key, param in model.named_parameters():
        if param.is_floating_point() and param.device.type != "meta" and not bool(torch.isfinite(param).all()):
            raise PosprobeError(
                f"tensor '{key}' of '{name}' contains NaN or infinite values",
                "the checkpoint is broken; use another one",
            )


def load_tokenizer(
    folder, hint: str = "use a model folder that also holds its tokenizer files (tokenizer.json / vocab.txt)"
):
    """The tokenizer saved in `folder` (never remote code); anything transformers raises is one PosprobeError."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as err:  # missing files, unreadable json, unknown tokenizer class: all "no tokenizer here"
        reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise PosprobeError(f"no usable tokenizer in '{folder}' ({reason})", hint) from err
