"""Edits of a run (SPEC §20, `--edit KIND:ARGS`): change one thing inside the model and measure what it does.

- `spec.py`: the edits as written, parsed into frozen dataclasses (`parse_edits`), and checked against a model's
  config before any weight is read (`edit_model`, `check_edits`); pure, no torch;
- `apply.py`: `EditRun`, the edits on a loaded model (taps on the attention kernel, forward hooks), and `MeanPass`,
  the first pass that collects the means `=mean` edits set.

`prepare_edits(edits, config, name, longest)` parses and checks them in one call (what a pipeline does first).
"""

from __future__ import annotations

from collections.abc import Iterable

from posprobe.edits.spec import (
    AttendEdit,
    BandEdit,
    ChannelEdit,
    Edit,
    EditModel,
    HeadEdit,
    RopeKeepEdit,
    ShiftEdit,
    check_edits,
    describe,
    edit_model,
    needs_means,
    parse_edit,
    parse_edits,
)


def prepare_edits(edits: Iterable | str | None, config: dict, name: str, longest: int | None = None) -> tuple:
    """`edits` (strings or parsed) parsed and checked against `config` (the most tokens of a forward pass
    `longest`, for shift on a learned table); () for none."""
    parsed = parse_edits(edits)
    if parsed:
        check_edits(parsed, edit_model(config, name), longest)
    return parsed


__all__ = [
    "AttendEdit",
    "BandEdit",
    "ChannelEdit",
    "Edit",
    "EditModel",
    "HeadEdit",
    "RopeKeepEdit",
    "ShiftEdit",
    "check_edits",
    "describe",
    "edit_model",
    "needs_means",
    "parse_edit",
    "parse_edits",
    "prepare_edits",
]
