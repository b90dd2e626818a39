"""Building a plain torch model (and its tokenizer) from a resolved checkpoint with transformers, and the checks
around it: `build_model` (used by `posprobe.load_model` and `retrofit`), `load_tokenizer`.

Before transformers touches the checkpoint: its config names a model type transformers knows, and every
safetensors file passes posprobe's own header check (a GGUF file was checked when it was resolved), so a damaged
file is one clear line, not a SafetensorError. While it loads: transformers' logging, progress bars and Python
warnings are silenced unless `verbose`. After: every parameter is finite. Whatever the libraries still raise
becomes one `PosprobeError`. A GGUF checkpoint is built by `from_pretrained(folder, gguf_file=...)`, which
de-quantises every tensor to float32 (posprobe's analyses read the same values lazily: `gguf_weights`).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import re
import warnings
from pathlib import Path

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

        reader = WeightReader(source.path, "safetensors")  # the files transformers will read, and the index, checked
        for file in sorted(source.path.glob("*.safetensors")):  # and any other it might pick instead
            read_header(file)
        _check_layer_bound(source, len(list(reader.keys())))


def _check_layer_bound(source: ModelSource, n_tensors: int) -> None:
    """A config claiming more layers than the checkpoint has tensors (every layer stores at least one of its own;
    ALBERT's shared layers are fewer than its tensors too) is refused before transformers builds them: a crafted
    num_hidden_layers = 2**31 had it build layers until memory ran out."""
    from posprobe.architectures.config import config_where

    for key in ("num_hidden_layers", "n_layer", "n_layers", "num_layers"):
        layers = source.config.get(key)
        if isinstance(layers, int) and layers > max(n_tensors, 1):
            raise PosprobeError(
                f"{config_where(source.name)} gives {key} = {layers}, more layers than its weights hold tensors "
                f"({n_tensors})",
                "the config and the weights come from different models; download the checkpoint again",
            )


@contextlib.contextmanager
def quiet_libraries(verbose: bool = False):
    """Silence transformers' and huggingface_hub's logging and progress bars, accelerate's logging (its "Some
    parameters are on the meta device" line under `--device auto`) and Python warnings (unless `verbose`); the
    previous settings are restored afterwards."""
    if verbose:
        yield
        return
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hub_bars_off = are_progress_bars_disabled()
    accelerate = logging.getLogger("accelerate")  # a plain Python logger, outside transformers' verbosity
    accelerate_level = accelerate.level
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    accelerate.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        accelerate.setLevel(accelerate_level)
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
    """Refuse a model with NaN or infinite parameters (it would train and score as if nothing were wrong). A finite
    sum proves every entry finite (a NaN or an infinity makes any sum non-finite) at a twentieth of the cost of
    `isfinite` on every entry; only a tensor whose sum is not finite (an overflow too) is checked entry by entry."""
    import torch

    for key, param in model.named_parameters():
        if not param.is_floating_point() or param.device.type == "meta":
            continue
        with torch.no_grad():
            if bool(torch.isfinite(param.sum())) or bool(torch.isfinite(param).all()):
                continue
        raise PosprobeError(
            f"tensor '{key}' of '{name}' contains NaN or infinite values", "the checkpoint is broken; use another one"
        )


def build_model(source: ModelSource, model_class=None, *, verbose: bool = False, **kwargs):
    """The transformers model of a resolved checkpoint as `model_class` (default `AutoModel`) builds it, with the
    checks above; extra `kwargs` go to `from_pretrained`. A retrofitted mechanism is not installed here (that is
    `posprobe.load_model`). Inside `shared.shared_loads()` (a report) a checkpoint is built once."""
    from posprobe.checkpoint.shared import shared_model

    if model_class is None:
        from transformers import AutoModel

        model_class = AutoModel
    return shared_model(source, model_class, kwargs, lambda cls, kw: _build_model(source, cls, verbose, kw))


def _build_model(source: ModelSource, model_class, verbose: bool, kwargs: dict):
    """`build_model`'s one load: `model_class.from_pretrained` with the checks around it."""
    kwargs = dict(kwargs)
    folder = source.path
    if source.weight_format == "gguf":
        folder, kwargs["gguf_file"] = source.path.parent, source.path.name
    else:
        kwargs.setdefault("use_safetensors", source.weight_format == "safetensors")
    if model_class.__name__ in ("AutoModel", "AutoModelForCausalLM"):  # a wrapper transformers cannot build or run
        kwargs |= language_model_alone(source)  # on text: its language model alone (Gemma 3n, Llama 4)
    check_before_load(source)
    from posprobe.runtime.phases import phase

    phase(
        f"reading the weights of {source.name}"
        + (" (de-quantising the GGUF file)" if source.weight_format == "gguf" else "")
    )
    with quiet_libraries(verbose), _quiet_gguf_progress(source.weight_format == "gguf" and not verbose):
        try:
            model, info = model_class.from_pretrained(str(folder), output_loading_info=True, **kwargs)
        except Exception as err:  # transformers, safetensors, torch and config classes raise many types
            raise load_failure(source, err) from err
    check_complete(model, info.get("missing_keys") or (), source.name)
    check_finite(model, source.name)
    return model


def language_model_alone(source: ModelSource) -> dict:
    """`from_pretrained` keywords that build a wrapper's language model alone from the wrapper's files
    (`Family.language_model_alone`: Gemma 3n, whose timm vision tower transformers builds only with timm; Llama 4,
    whose forward fails on text): its nested config, and the names under its module renamed to its causal LM's
    ('model.' + the base model's names where the wrapper holds a base model, its own where it holds a causal LM, as
    Llama 4's 'language_model.model.' / 'language_model.lm_head.'); an auto class then builds the language model's
    own class. {} for every other checkpoint, and for a wrapper whose config nests no such config (transformers
    then says what is wrong)."""
    from posprobe.architectures import table as T
    from posprobe.architectures.config import validate_config

    family = T.family_for_type(source.model_type)
    if family is None or not family.language_model_alone:
        return {}
    text = T.language_model_config(source.config)
    if text.get("model_type") != family.language_model[2] or source.model_type == family.language_model[2]:
        return {}
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[text["model_type"]].from_dict(validate_config(text, source.name))
    module, causal = re.escape(family.language_model[1]), r"(?=model\.|lm_head\.)"  # a causal LM under the module
    renames = {rf"^(?:.*\.)?{module}\.{causal}": "", rf"^(?:.*\.)?{module}\.(?!model\.|lm_head\.)": "model."}
    return {"config": config, "key_mapping": renames}


def check_complete(model, missing_keys, name: str) -> None:
    """Refuse a model built with base-model weights missing from the checkpoint: transformers fills them with
    random values and only logs it, so a file that lost a tensor (a crafted or cut-down file, a GGUF file whose
    header lists fewer tensors) would be measured as if it were trained. A task head (classifier, score) and
    the pooler are expected to be missing from a base checkpoint and are not refused."""
    prefix = "" if getattr(model, "base_model", model) is model else f"{model.base_model_prefix}."
    lost = sorted(k for k in missing_keys if k.startswith(prefix) and "pooler" not in k.split("."))
    if lost:
        shown = ", ".join(f"'{k}'" for k in lost[:2]) + (f" and {len(lost) - 2} more" if len(lost) > 2 else "")
        raise PosprobeError(
            f"'{name}' lacks {len(lost)} weight tensor{'s' if len(lost) > 1 else ''} its model needs ({shown}); "
            f"transformers would fill {'them' if len(lost) > 1 else 'it'} with random values",
            "the file is incomplete or belongs to another model; download or convert it again",
        )


@contextlib.contextmanager
def _quiet_gguf_progress(quiet: bool):
    """No "Converting and de-quantizing GGUF tensors" bar: transformers draws it with tqdm directly, outside its
    own progress-bar switch."""
    if not quiet:
        yield
        return
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bar = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def load_tokenizer(
    folder, hint: str = "use a model folder that also holds its tokenizer files (tokenizer.json / vocab.txt)"
):
    """The tokenizer saved in `folder`, or held by a .gguf file (`folder` the file: transformers converts the
    vocabulary it stores), never remote code; anything transformers raises is one PosprobeError."""
    from transformers import AutoTokenizer

    kwargs = {}
    path = where = Path(folder)
    if path.suffix.lower() == ".gguf" and path.is_file():
        path, kwargs["gguf_file"] = path.parent, path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False, **kwargs)
    except Exception as err:  # missing files, unreadable json, unknown tokenizer class: all "no tokenizer here"
        reason = first_line(err, 160)
        if isinstance(err, (KeyError, AttributeError, TypeError, ValueError)):  # a field missing or of a wrong type
            reason = f"{type(err).__name__}: {reason}"
        raise PosprobeError(f"no usable tokenizer in '{where}' ({reason})", hint) from err
    _check_vocabulary(tokenizer, where, hint)
    return tokenizer


def _check_vocabulary(tokenizer, where: Path, hint: str) -> None:
    """Refuse a tokenizer whose vocabulary holds its special tokens only: transformers builds one from a
    tokenizer_config.json whose tokenizer.json / vocab.txt is missing (a download cut short), and it turns every
    word into the unknown token, so every text would measure the same [UNK] sequence."""
    try:
        size, special = len(tokenizer), set(tokenizer.all_special_ids)
    except Exception:  # a tokenizer class without these (none known): nothing to check
        return
    if size <= len(special):
        raise PosprobeError(
            f"the tokenizer in '{where}' has no vocabulary, only its {size} special tokens (its tokenizer.json "
            "or vocab.txt is missing), so every word would be the unknown token",
            hint,
        )
