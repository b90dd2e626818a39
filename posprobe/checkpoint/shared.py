"""One load per checkpoint for a run of several commands in one process (`posprobe report`).

While `shared_loads()` is active, `loading.build_model` builds each checkpoint once and hands the same model to
every later request for it, and `weights.open_weights` opens each checkpoint's lazy reader once (a GGUF file's
header and name map are then read once). Outside it nothing is kept.

What a fresh load would give is kept exact: a request's `attn_implementation` (None: the one the checkpoint loads
with by default) is set on the shared model before it is handed out; a request for the base model (`AutoModel`) is
answered with the causal LM's own base model when `causal=True` said that a causal LM will be wanted too (one load
for both), and only when that base model is of the class `AutoModel` builds (not for a multimodal wrapper read as
its language model). A retrofitted checkpoint (its mechanism is installed on the built model afterwards), a model
that cannot switch its attention, or a request with other keywords (a device map) is built apart, as without
sharing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

RETROFIT_KEY = "posprobe"  # config.json key of a retrofitted checkpoint (`retrofitting.install.CONFIG_KEY`)


@dataclass
class _Shared:
    causal: bool
    models: dict = field(default_factory=dict)  # (path, format, class name) -> (model, its default attention)
    readers: dict = field(default_factory=dict)  # (path, format, name) -> lazy reader


_active: _Shared | None = None


@contextlib.contextmanager
def shared_loads(causal: bool = False):
    """Share loaded models and readers until the block ends (nested: the outer block's). `causal`: a causal LM of
    the checkpoint will be asked for, so a base-model request is answered from it."""
    global _active
    if _active is not None:
        yield
        return
    _active = _Shared(causal)
    try:
        yield
    finally:
        _active = None


def shared_reader(source, open_reader):
    """The lazy reader of `source`: `open_reader(source)` once per checkpoint while sharing, else every time."""
    if _active is None:
        return open_reader(source)
    key = (str(source.path), source.weight_format, source.name)
    if key not in _active.readers:
        _active.readers[key] = open_reader(source)
    return _active.readers[key]


def shared_model(source, model_class, kwargs: dict, build):
    """The model `build(model_class, kwargs)` gives for `source`, built once per checkpoint while sharing (see the
    module docstring); `build` is `loading.build_model`'s own load."""
    wanted = kwargs.get("attn_implementation")
    rest = {k: v for k, v in kwargs.items() if k != "attn_implementation"}
    if _active is None or rest or source.config.get(RETROFIT_KEY) or not isinstance(wanted, (str, type(None))):
        return build(model_class, kwargs)
    name = getattr(model_class, "__name__", "")
    base = name == "AutoModel" and _active.causal and source.wrapper is None
    shared_class = model_class
    if base:
        from transformers import AutoModelForCausalLM

        shared_class, name = AutoModelForCausalLM, "AutoModelForCausalLM"
    key = (str(source.path), source.weight_format, name)
    if key not in _active.models:
        model = build(shared_class, {})
        _active.models[key] = (model, model.config._attn_implementation)
    model, default = _active.models[key]
    if base:
        model = _base_model_as_built(model, source)
    if model is None or not _switch_attention(model, wanted or default):
        return build(model_class, kwargs)
    return model


def _base_model_as_built(causal_lm, source):
    """The causal LM's base model when it is of the class `AutoModel` builds for the config, else None."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    base = getattr(causal_lm, "base_model", None)
    expected = MODEL_MAPPING_NAMES.get(str(source.config.get("model_type")))
    return base if base is not causal_lm and type(base).__name__ == expected else None


def _switch_attention(model, implementation: str) -> bool:
    """Set `implementation` on a shared model (as a fresh load with it would have it); False when it cannot."""
    if getattr(model.config, "_attn_implementation", None) == implementation:
        return True
    can_switch = getattr(model, "_can_set_attn_implementation", None)  # False outside AttentionInterface (Falcon)
    if callable(can_switch) and not can_switch():
        return False  # asked anyway, transformers would warn and still switch the sub-configs
    previous = model.config._attn_implementation
    try:
        model.set_attn_implementation(implementation)
    except Exception:  # noqa: BLE001 - transformers refuses a switch in several ways
        with contextlib.suppress(Exception):
            model.set_attn_implementation(previous)  # as it was for the requests that get it
        return False
    return getattr(model.config, "_attn_implementation", None) == implementation
