"""The `--text` options shared by commands that read real text (`fhat`, `profiles`: SPEC §13; `rotary`: SPEC §15;
`attention`, `states`), defined once: the option types, the check of the texts before any model is read, and the
progress bar over texts while the library runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Annotated

import typer

DEFAULT_BATCH_SIZE = 32
DEFAULT_MIN_TEXTS = 16


class TextInput(str, Enum):
    mean = "mean"
    position_mean = "position-mean"


_TEXT_HELP = (
    "Texts: one per line (.txt), .jsonl / .csv with --column, or a hub dataset split hub:NAME[:CONFIG]:SPLIT with "
    "--column (e.g. NAME nyu-mll/glue, CONFIG cola, SPLIT validation), or builtin:sentences / builtin:kjv (texts "
    "in the box)."
)
TextOpt = Annotated[str | None, typer.Option("--text", help=_TEXT_HELP)]
DEFAULT_TEXT = "builtin:sentences"  # posprobe.corpora.SENTENCES: what `attention` and `states` read without --text
# attention, states: they need texts, so without --text they read the 144 packaged sentences
DefaultTextOpt = Annotated[str, typer.Option("--text", help=_TEXT_HELP + " Default: the 144 packaged sentences.")]
ColumnOpt = Annotated[str | None, typer.Option("--column", help="Column of a .jsonl/.csv file with the texts.")]
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
    int | None, typer.Option("--min-texts", help="position-mean: positions need this many texts (default 16).")
]
MaxLengthOpt = Annotated[
    int | None, typer.Option("--max-length", help="Tokens per text (truncated); default 128 or fewer.")
]
MaxTextsOpt = Annotated[int | None, typer.Option("--max-texts", help="Use at most this many texts.")]
BatchSizeOpt = Annotated[int | None, typer.Option("--batch-size", help="Texts per forward pass (default 32).")]
DeviceOpt = Annotated[
    str | None,
    typer.Option(
        "--device",
        help="cpu, cuda, ... (default: cuda if available); auto: accelerate's big-model inference (layers over the "
        "GPUs, the CPU and disk), for models larger than memory.",
    ),
]
MaxMemoryOpt = Annotated[
    str | None,
    typer.Option("--max-memory", help="With --device auto: memory per device, e.g. cpu=8GiB,0=20GiB (past it: disk)."),
]


def check_text_options(text: str | None, **options) -> int | None:
    """The number of texts `--text` will use (the file checked: exists, right column, not empty), or None without
    `--text`, where every other text option (`options`: name -> value, None when not given) must be unset."""
    from posprobe.errors import ArgumentValueError
    from posprobe.texts import check_texts
    from posprobe.validation import as_int

    if text is None:
        for name, value in options.items():
            if value is not None:
                raise ArgumentValueError(name, "{arg} applies only with --text", "pass --text FILE, or drop {arg}")
        return None
    for name in ("max_texts", "batch_size", "min_texts"):
        if options.get(name) is not None:
            as_int(options[name], name, minimum=1)
    if options.get("max_length") is not None:
        as_int(options["max_length"], "max_length", minimum=2)
    if options.get("max_memory") is not None:  # before any folder is made: --max-memory needs --device auto
        from posprobe.capture.model import check_max_memory

        check_max_memory(options.get("device"), options["max_memory"])
    total = check_texts(text, options.get("column"), options.get("max_texts"))
    if options.get("input") == TextInput.position_mean:
        check_min_texts(options.get("min_texts") or DEFAULT_MIN_TEXTS, total, text, "position-mean")
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
    from posprobe.texts import iter_texts

    column = options.pop("column", None)
    kwargs = {name: value for name, value in options.items() if value is not None}
    if isinstance(kwargs.get("input"), Enum):
        kwargs["input"] = kwargs["input"].value
    with text_progress(total) as advance:
        yield kwargs | {"texts": iter_texts(text, column), "progress": advance}


def with_text_source(result, text: str | None):
    """`result` with the `--text` argument recorded in its conditioning record (the library does not know it)."""
    from dataclasses import replace

    if text is None or getattr(result, "conditioning", None) is None:
        return result
    return replace(result, conditioning={**result.conditioning, "text": str(text)})


def file_tag(result) -> str:
    """The mode part of output file names: the result's mode, and the input for 'position-mean'."""
    conditioning = getattr(result, "conditioning", None) or {}
    return result.mode + ("-position-mean" if conditioning.get("input") == TextInput.position_mean.value else "")


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
