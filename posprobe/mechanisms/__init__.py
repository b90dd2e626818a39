"""Positional mechanisms that can be retrofitted into pretrained attention layers.

`catalogue` is the one torch-free list of mechanisms (names, summaries, options, parameter counts) and is
what importing this package loads. The torch side — `REGISTRY` (name -> `PositionalMechanism` subclass),
the base class and the index helpers — is imported on first access, so `posprobe --help` and `params`
never import torch. A new mechanism is a catalogue entry plus a module with a `@register`-decorated class.
"""

from __future__ import annotations

from importlib import import_module

from posprobe.mechanisms.catalogue import (
    CATALOGUE,
    DEFAULT_KERNELS,
    DEFAULT_RADIUS,
    MECHANISM_NAMES,
    LayerShape,
    MechanismInfo,
    MechanismSettings,
    RadiusOptions,
    TisaOptions,
    check_kernels,
    check_radius,
    check_settings,
    mechanism_info,
)

_TORCH_NAMES = {
    "ROLES": "posprobe.mechanisms.base",
    "PositionalMechanism": "posprobe.mechanisms.base",
    "clipped_index": "posprobe.mechanisms.base",
    "get_mechanism": "posprobe.mechanisms.base",
    "offset_range": "posprobe.mechanisms.base",
    "offsets": "posprobe.mechanisms.base",
    "register": "posprobe.mechanisms.base",
    "relative_to_absolute": "posprobe.mechanisms.base",
    "toeplitz": "posprobe.mechanisms.base",
    "tisa_profile": "posprobe.mechanisms.tisa",
}

__all__ = [
    "CATALOGUE",
    "DEFAULT_KERNELS",
    "DEFAULT_RADIUS",
    "MECHANISM_NAMES",
    "REGISTRY",
    "LayerShape",
    "MechanismInfo",
    "MechanismSettings",
    "RadiusOptions",
    "TisaOptions",
    "check_kernels",
    "check_radius",
    "check_settings",
    "mechanism_info",
    *_TORCH_NAMES,
]


def __getattr__(name: str):
    """Lazy torch side: `REGISTRY` (every mechanism class imported) and the names in `_TORCH_NAMES`."""
    if name == "REGISTRY":
        from posprobe.mechanisms.catalogue import load_all

        load_all()
        registry = import_module("posprobe.mechanisms.base").REGISTRY
        ordered = {n: registry[n] for n in CATALOGUE} | registry  # catalogue order
        registry.clear()
        registry.update(ordered)
        return registry
    if name in _TORCH_NAMES:
        return getattr(import_module(_TORCH_NAMES[name]), name)
    raise AttributeError(f"module 'posprobe.mechanisms' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
