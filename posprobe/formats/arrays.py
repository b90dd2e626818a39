"""Arrays with named dimensions: the one `.npz` writer.

Every result that writes a `.npz` declares its arrays once, by name and dimension names, in a class attribute
`ARRAYS` (a plain dict, not a dataclass field)::

    ARRAYS = {
        "position_loss": ("variant", "position"),  # (V, L-1)
        "lengths": ("length",),
        "probe_r2_controls": optional("state", "draw"),  # written only when the run has it
        "uniform_distance": either(("layer",), ("layer", "head")),  # (L,), or (L, H) where heads pick their keys
        "*_profile_correlation": ("layer", "head"),  # a family of names (fnmatch pattern)
    }

`check_arrays(arrays, declaration)` checks what a result hands over against it before anything is written: every
array declared, every required one present, each array's number of dimensions one its declaration allows, and one
size per dimension name across all arrays (`layer` is 12 everywhere or the write fails). A mistake is an
`ArrayDeclarationError` naming the array, raised when the files are stated, so nothing is written. `write_arrays`
is the one function that writes a `.npz`: the arrays as they are (np.savez: the numbers are not touched) and the
JSON `metadata` entry with `dims` added, {array name: [dimension names]}; `load_named` reads both back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import numpy as np

from posprobe.formats.writing import load_npz, write_npz

Dims = tuple[str, ...]
DIMS_KEY = "dims"  # the metadata entry: {array name: [dimension names]}


class ArrayDeclarationError(ValueError):
    """A result handed over arrays its `ARRAYS` declaration does not allow (a bug in posprobe, not bad input)."""


@dataclass(frozen=True)
class Declared:
    """One declared array: the dimension names it may have (`shapes`, usually one) and whether it may be absent."""

    shapes: tuple[Dims, ...]
    optional: bool = False


def optional(*dims: str) -> Declared:
    """An array with dimensions `dims` that a result writes only when it has it."""
    return Declared((tuple(dims),), optional=True)


def either(*shapes: Dims, optional: bool = False) -> Declared:
    """An array with one of several dimension lists (told apart by their number: give each a different length)."""
    if len({len(s) for s in shapes}) != len(shapes):
        raise ArrayDeclarationError(f"either{shapes}: the alternatives must differ in their number of dimensions")
    return Declared(tuple(tuple(s) for s in shapes), optional)


def _declared(entry: Dims | Declared) -> Declared:
    return entry if isinstance(entry, Declared) else Declared((tuple(entry),))


def _entry(name: str, declaration: Mapping[str, Dims | Declared]) -> Declared | None:
    """The declaration of `name`: its own entry, else the first pattern (a name with '*') that matches it."""
    if name in declaration:
        return _declared(declaration[name])
    for pattern, entry in declaration.items():
        if "*" in pattern and fnmatchcase(name, pattern):
            return _declared(entry)
    return None


def check_arrays(arrays: Mapping[str, Any], declaration: Mapping[str, Dims | Declared], what: str) -> dict[str, Dims]:
    """{array name: its dimension names} for `arrays` (in their order), checked against `declaration`; `what` (the
    file or result) names the culprit in an `ArrayDeclarationError`."""
    missing = [n for n, e in declaration.items() if "*" not in n and not _declared(e).optional and n not in arrays]
    if missing:
        raise ArrayDeclarationError(f"{what}: declared array(s) {', '.join(missing)} not handed over")
    dims: dict[str, Dims] = {}
    sizes: dict[str, tuple[int, str]] = {}  # dimension name -> (size, the array it was first seen in)
    for name, value in arrays.items():
        entry = _entry(name, declaration)
        if entry is None:
            raise ArrayDeclarationError(f"{what}: array '{name}' is not declared (add it to the result's ARRAYS)")
        shape = np.shape(value)
        match = [s for s in entry.shapes if len(s) == len(shape)]
        if not match:
            allowed = " or ".join(str(s) for s in entry.shapes)
            raise ArrayDeclarationError(f"{what}: array '{name}' has shape {shape}, declared {allowed}")
        dims[name] = match[0]
        for dim, size in zip(match[0], shape):
            seen = sizes.setdefault(dim, (size, name))
            if seen[0] != size:
                raise ArrayDeclarationError(
                    f"{what}: dimension '{dim}' is {size} in '{name}' {shape} but {seen[0]} in '{seen[1]}'"
                )
    return dims


def write_arrays(path: Path, metadata: dict, arrays: Mapping[str, Any], dims: Mapping[str, Dims]) -> None:
    """Write `arrays` (as they are) and `metadata` with `dims` ({name: [dimension names]}, from `check_arrays`) to
    `path`: the one `.npz` writer (a `write_files` writer; `load_named` / `writing.load_npz` read it back)."""
    write_npz(path, {**metadata, DIMS_KEY: {name: list(d) for name, d in dims.items()}}, **arrays)


def load_named(path: str | Path) -> tuple[dict, dict[str, tuple[Dims, np.ndarray]]]:
    """(metadata, {name: (dimension names, array)}) of a `.npz` posprobe wrote; an array of a file written before
    the declarations (no `dims` entry) gets ('dim_0', 'dim_1', ...)."""
    metadata, arrays = load_npz(path)
    dims = metadata.get(DIMS_KEY) or {}
    return metadata, {
        name: (tuple(dims.get(name) or (f"dim_{i}" for i in range(a.ndim))), a) for name, a in arrays.items()
    }
