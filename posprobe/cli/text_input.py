"""The `--text` handling shared by commands that read real text (`fhat`, `profiles`: SPEC §13; `rotary`: SPEC §15;
`attention`, `states`): the data-conditioning options, the check of the texts and of the run's settings before any
model is read, and the progress bar over texts while the library runs. The run-over-texts options themselves
(`--text`, `--column`, `--max-length`, `--max-texts`, `--batch-size`, `--device`, `--max-memory`) are defined once
in `cli.options`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Annotated

import typer

from posprobe.cli.options import DEFAULT_BATCH_SIZE
from posprobe.pipelines.defaults import MIN_TEXTS


class TextInput(str, Enum):
    mean = "mean"
    position_mean = "position-mean"


InputOpt = Annotated[
    TextInput | None,
    typer.Option(
        "--input",
        help="With --text: 'mean' (x_l over tokens at positions ≥ 1) or 'position-mean' (x_l(i) per position). "
        "Default: position-mean for a model with a position table (learned or sinusoidal: 'mean' would average "
        "it away), mean otherwise.",
    ),
]
MinTextsOpt = Annotated[
    int | None,
    typer.Option("--min-texts", help=f"position-mean: positions need this many texts (default {MIN_TEXTS})."),
]


def check_text_options(text: str | None, **options) -> int | None:
    """The number of texts `--text` will use (the file checked: exists, right column, not empty), or None without
    `--text`, where every other text option (`options`: name -> value, None when not given) must be unset."""
    from posprobe.capture.textrun import check_run_settings
    from posprobe.errors import ArgumentValueError
    from posprobe.texts.reading import check_texts
    from posprobe.validation import as_int

    if text is None:
        for name, value in options.items():
            if value is not None:
                raise ArgumentValueError(name, "{arg} applies only with --text", "pass --text FILE, or drop {arg}")
        return None
    check_run_settings(
        options.get("max_length"),
        options.get("max_texts"),
        DEFAULT_BATCH_SIZE if options.get("batch_size") is None else options["batch_size"],
        device=options.get("device"),
        max_memory=options.get("max_memory"),
    )
    if options.get("min_texts") is not None:
        as_int(options["min_texts"], "min_texts", minimum=1)
    total = check_texts(text, options.get("column"), options.get("max_texts"))
    if options.get("input") == TextInput.position_mean:
        check_min_texts(options.get("min_texts") or MIN_TEXTS, total, text, "position-mean")
    return total


def check_min_texts(min_texts: int, total: int, text: str, who: str) -> None:
    """Refuse, before any model is read, a `--min-texts` above the number of texts: no position can then be reached
    by that many texts (`who` says what would have been left without positions)."""
    from posprobe.errors import ArgumentValueError

    if min_texts > total:
        raise ArgumentValueError(
            "min_texts",
            f"{who} use only positions reached by at least {{arg={min_texts}}} texts, and '{text}' gives only {total}",
            f"pass {{arg}} {total} or less, or more texts",
        )


@contextmanager
def text_run(text: str | None, total: int | None, **options) -> Iterator[dict]:
    """The library keywords for `--text` (texts read lazily, progress advanced per batch; options left unset keep the
    library's defaults) inside a progress bar over texts on stderr; {} without `--text`."""
    if text is None:
        yield {}
        return
    from posprobe.cli.console import text_progress
    from posprobe.texts.reading import iter_texts

    column = options.pop("column", None)
    kwargs = {name: value for name, value in options.items() if value is not None}
    if "edit" in kwargs:  # --edit: the library's edits
        kwargs["edits"] = kwargs.pop("edit")
    if isinstance(kwargs.get("input"), Enum):
        kwargs["input"] = kwargs["input"].value
    with text_progress(total) as advance:
        yield kwargs | {"texts": iter_texts(text, column), "progress": advance}


def check_edits(edit: list[str] | None, source, max_length: int | None) -> None:
    """Refuse, before any weight is read, `--edit`s that cannot apply to the resolved `source` (SPEC §20)."""
    if edit:
        from posprobe.capture.model import DEFAULT_MAX_LENGTH
        from posprobe.edits import prepare_edits

        prepare_edits(edit, source.config, source.name, max_length or DEFAULT_MAX_LENGTH)


def with_text_source(result, text: str | None):
    """`result` with the `--text` argument recorded in its conditioning record (the library does not know it)."""
    from dataclasses import replace

    if text is None or getattr(result, "conditioning", None) is None:
        return result
    return replace(result, conditioning={**result.conditioning, "text": str(text)})


def conditioning_lines(result) -> list[str]:
    """What a data-conditioned result was computed from, and what it can show, for the text output."""
    c = getattr(result, "conditioning", None)
    if c is None:
        return []
    where = f" from {c['text']}" if c.get("text") else ""
    extra = f", positions with at least {c['min_texts']} texts" if c["input"] == TextInput.position_mean.value else ""
    return [
        f"data-conditioned (SPEC §13): input {c['input']} of {c['n_texts']} texts{where} ({c['n_tokens']} tokens, "
        f"max length {c['max_length']}{extra})",
        c["note"],
    ]
