"""What every posprobe result offers in a notebook: a one-line repr (arrays shown by shape) and `to_json`.

A result class lists the fields its repr shows in `_repr_fields` and defines `to_dict()` (plain JSON types,
an undefined R^2 as None) and `plot()` (a matplotlib Figure from posprobe.plotting.base).
"""

from __future__ import annotations

import json
from dataclasses import fields

import numpy as np


def short(value) -> str:
    """A value for a repr: arrays as <array AxB>, floats to 4 digits, long lists cut."""
    if isinstance(value, np.ndarray):
        return f"<array {'x'.join(map(str, value.shape))}>"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, dict) and len(value) <= 8:
        return "{" + ", ".join(f"{k!r}: {short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"[{', '.join(map(repr, value[:4]))}, ... ({len(value)} items)]"
    return repr(value)


class ResultMixin:
    """Short repr and JSON text for the frozen result dataclasses (declare them with `repr=False`)."""

    _repr_fields: tuple[str, ...] = ()

    def __repr__(self) -> str:
        names = self._repr_fields or tuple(f.name for f in fields(self))
        return f"{type(self).__name__}({', '.join(f'{n}={short(getattr(self, n))}' for n in names)})"

    def to_dict(self) -> dict:  # pragma: no cover - every result defines it
        raise NotImplementedError

    def to_json(self, indent: int | None = 2) -> str:
        """`to_dict()` as JSON text (an undefined R^2 is null): the CLI's `--json` record without file paths."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def middle_ellipsis(text: str, width: int) -> str:
    """`text` shortened to `width` characters by cutting its middle ('/very/lo…/model')."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = (width - 1 + 1) // 2
    tail = width - 1 - head
    return text[:head] + "…" + (text[-tail:] if tail else "")
