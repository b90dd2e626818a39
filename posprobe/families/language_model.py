"""Multimodal wrappers read as their language model (Gemma 3, Qwen3.5, Fuyu, Emu3, Mllama, ModernVBERT, ...).

A wrapper's config nests its language model's config (`text_config`), and its checkpoint holds that model's
tensors under one module (`language_model`, `text_model`) beside a vision or audio tower whose tensors may end in
the same suffixes (`...layers.0.self_attn.q_proj.weight`). `language_model_view` gives the model reader the
language model alone: the nested config (its own model type, read by its own family entry) and a reader that sees
only the tensors under that module, whatever comes before it ('language_model.model.' on disk,
'model.language_model.' when loaded). The table names the wrappers (`Family.language_model`).
"""

from __future__ import annotations

from dataclasses import replace

from posprobe.architectures import table as T
from posprobe.architectures.config import config_hint, validate_config
from posprobe.checkpoint.resolve import shortest_suffix
from posprobe.errors import PosprobeError


class LanguageModelReader:
    """A tensor reader restricted to the names under module `module` (a whole dotted component of the name), or,
    where none is and the wrapper names its `towers` (`Family.towers`: Dots3's files keep the language model at the
    top level), to the names under none of those: `keys` and `find_suffix` see those only; everything else is the
    wrapped reader's."""

    def __init__(self, reader, module: str, towers: tuple[str, ...] = ()):
        self._reader, self._module = reader, module
        self._names = [k for k in reader.keys() if f".{module}." in f".{k}"]
        if not self._names and towers:
            self._names = [k for k in reader.keys() if not any(f".{tower}." in f".{k}" for tower in towers)]

    def keys(self) -> list[str]:
        return list(self._names)

    def __contains__(self, key: str) -> bool:
        return key in self._names

    def find_suffix(self, suffix: str) -> str | None:
        """The shortest name under the module ending in `suffix`, as the readers' own `find_suffix`."""
        return shortest_suffix(self._names, suffix)

    def __getattr__(self, name: str):
        return getattr(self._reader, name)


def language_model_view(source, reader):
    """(source, reader) of the language model a multimodal checkpoint holds (`Family.language_model`): the source's
    config is the nested config (validated as config.json is) and `wrapper` names the checkpoint's own type; the
    reader sees the language model's tensors only. Other checkpoints are returned as they are. One line refuses a
    wrapper whose config lacks the nested config or nests another model type than the table reads."""
    family = T.family_for_type(source.model_type)
    if source.wrapper or family is None or family.language_model is None:
        return source, reader
    if source.model_type == family.language_model[2]:  # a language model listed with its wrapper, saved alone
        return source, reader
    key, module, text = family.language_model
    nested = source.config.get(key)
    if not isinstance(nested, dict) or nested.get("model_type", text) != text:
        found = nested.get("model_type") if isinstance(nested, dict) else None
        raise PosprobeError(
            f"'{source.name}' ({source.model_type}) nests "
            + (f"a '{found}' language model" if found else f"no language model config ({key})")
            + f"; posprobe reads a {source.model_type} checkpoint as its '{text}' language model",
            config_hint(source.name, "pass a checkpoint whose config.json is as transformers saves it"),
        )
    config = validate_config(T.language_model_config(source.config), source.name)
    reader = None if reader is None else LanguageModelReader(reader, module, family.towers)  # None: config alone
    return replace(source, config=config, wrapper=source.model_type), reader
