"""Argument checks shared by the library and the CLI: each setting is validated here, in one place.

Every function returns the value in its canonical type or raises `ArgumentTypeError` / `ArgumentValueError`
naming the argument (rendered `{arg}`: the parameter name in the library, the flag on the command line).
`bool` is never accepted as a number, and numbers are never accepted as strings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral, Real
from pathlib import Path

from posprobe.errors import ArgumentTypeError, ArgumentValueError


def _is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def as_int(value, name: str, *, minimum: int | None = None, maximum: int | None = None, hint: str | None = None) -> int:
    """`value` as an int within [minimum, maximum]; floats (even 2.0), strings and bools are refused."""
    if not _is_int(value):
        raise ArgumentTypeError(name, f"{{arg}} must be a whole number, got {value!r}", hint)
    value = int(value)
    if hint is None:  # say what to do, not only what is wrong
        if minimum is not None and maximum is not None:
            hint = f"pass {{arg}} between {minimum} and {maximum}"
        else:
            hint = f"pass {{arg}} of {minimum} or more" if minimum is not None else f"pass {{arg}} of {maximum} or less"
    if minimum is not None and value < minimum:
        raise ArgumentValueError(name, f"{{arg}} must be at least {minimum}, got {value}", hint)
    if maximum is not None and value > maximum:
        raise ArgumentValueError(name, f"{{arg}} must be at most {maximum}, got {value}", hint)
    return value


def as_float(
    value,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
    hint: str | None = None,
) -> float:
    """`value` as a finite float (ints accepted); `positive` requires > 0."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ArgumentTypeError(name, f"{{arg}} must be a number, got {value!r}", hint)
    value = float(value)
    if not math.isfinite(value):
        raise ArgumentValueError(name, f"{{arg}} must be finite, got {value}", hint)
    if positive and value <= 0:
        raise ArgumentValueError(name, f"{{arg}} must be positive, got {value:g}", hint)
    if minimum is not None and value < minimum:
        raise ArgumentValueError(name, f"{{arg}} must be at least {minimum:g}, got {value:g}", hint)
    if maximum is not None and value > maximum:
        raise ArgumentValueError(name, f"{{arg}} must be at most {maximum:g}, got {value:g}", hint)
    return value


def as_bool(value, name: str) -> bool:
    """Only real booleans (and numpy's) are accepted: `cosine='yes'` is a mistake, not True."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise ArgumentTypeError(name, f"{{arg}} must be True or False, got {value!r}")


def as_choice(value, name: str, choices: Iterable[str]) -> str:
    """`value` if it is one of `choices` (strings)."""
    choices = list(choices)
    if not isinstance(value, str):
        raise ArgumentTypeError(name, f"{{arg}} must be one of {', '.join(choices)}, got {value!r}")
    if value not in choices:
        raise ArgumentValueError(name, f"unknown {{arg}} '{value}'", f"use one of: {', '.join(choices)}")
    return value


def as_int_list(
    value,
    name: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    allow_none: bool = True,
    hint: str | None = None,
) -> list[int] | None:
    """A list of whole numbers (duplicates dropped, order kept). None stays None when `allow_none`.

    A bare int is refused with a hint to wrap it (`layers=[3]`), as is a string."""
    if value is None:
        if allow_none:
            return None
        raise ArgumentTypeError(name, "{arg} must be a list of whole numbers, got None")
    if _is_int(value) or isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ArgumentTypeError(
            name,
            f"{{arg}} must be a list of whole numbers, got {value!r}",
            f"wrap a single value in a list, e.g. {name}=[{value!r}]" if _is_int(value) else None,
        )
    out: list[int] = []
    for item in value:
        item = as_int(item, name, minimum=minimum, maximum=maximum, hint=hint)
        if item not in out:
            out.append(item)
    if not out:
        raise ArgumentValueError(name, "{arg} is empty", "give at least one value")
    return out


def as_index(value, name: str, count: int, *, what: str = "layer") -> int:
    """A Python-style index into `count` items: -1 is the last. Returns the non-negative index."""
    value = as_int(value, name)
    if not -count <= value < count:
        raise ArgumentValueError(
            name, f"{what} {value} does not exist (valid: 0..{count - 1}, or -1 for the last)", "pick one with {arg}"
        )
    return value % count


def as_path(value, name: str) -> Path:
    """A str or os.PathLike as an expanded Path."""
    import os

    if not isinstance(value, (str, os.PathLike)) or (isinstance(value, str) and not value):
        raise ArgumentTypeError(name, f"{{arg}} must be a path, got {value!r}")
    return Path(value).expanduser()
