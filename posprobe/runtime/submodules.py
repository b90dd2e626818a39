"""Submodules on first use (PEP 562): `posprobe.plotting.base` in a notebook without importing it first, whatever
other code imported before."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType


def importer(package: str) -> Callable[[str], ModuleType]:
    """A module-level `__getattr__` for `package`: its submodule `name`, imported on first use; AttributeError for
    a name that is no submodule (so `hasattr` and `getattr(..., default)` behave)."""

    def __getattr__(name: str) -> ModuleType:
        if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module '{package}' has no attribute '{name}'")

    return __getattr__
