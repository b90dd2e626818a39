"""Option types shared by every command, defined once."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from posprobe.pipelines.defaults import TEXT


class FigureFormat(str, Enum):
    png = "png"
    pdf = "pdf"
    svg = "svg"


class Scale(str, Enum):
    shared = "shared"
    per_head = "per-head"


class Mode(str, Enum):
    paper = "paper"
    faithful = "faithful"


ModelArg = Annotated[
    str | None,
    typer.Argument(
        help="Hub model id, local folder or .gguf file ('SmolLM2-135M-Instruct' = packaged); default: the packaged "
        "all-MiniLM-L6-v2.",
        show_default=False,
    ),
]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Output folder (default: posprobe-out/<command>/<model>).")]
FormatOpt = Annotated[FigureFormat, typer.Option("--format", help="Figure file format.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout (for scripts).")]
AllowPickleOpt = Annotated[
    bool, typer.Option("--allow-pickle", help="Allow pickle (.bin) weights from a source you trust.")
]
ModeOpt = Annotated[
    Mode,
    typer.Option("--mode", help="paper: SPEC §3 formula; faithful: real first-layer input (LayerNorm, biases)."),
]


PositionsOpt = Annotated[
    int | None,
    typer.Option(
        "--positions",
        help="Positions n analysed. Default: the whole learned table; models without one: min(their maximum, 512).",
    ),
]


class Stack(str, Enum):
    encoder = "encoder"
    decoder = "decoder"


StackOpt = Annotated[Stack, typer.Option("--stack", help="Encoder-decoder models (T5): which stack's attention.")]


# ---- one run over texts (`posprobe.capture.textrun.TextRun`): attention, states, rotary --text, profiles/fhat --text,
# context, needle; each number is checked by `capture.textrun.check_run_settings`
DEFAULT_BATCH_SIZE = 32  # capture.textrun.DEFAULT_BATCH_SIZE (the option shows it; tests/test_textrun.py ties them)
_TEXT_HELP = (
    "Texts: one per line (.txt), .jsonl / .csv with --column, or a hub dataset split hub:NAME[:CONFIG]:SPLIT with "
    "--column (e.g. NAME nyu-mll/glue, CONFIG cola, SPLIT validation), or builtin:sentences / builtin:kjv (texts "
    "in the box)."
)
TextOpt = Annotated[str | None, typer.Option("--text", help=_TEXT_HELP)]
DEFAULT_TEXT = TEXT  # what `attention` and `states` read without --text: the 144 packaged sentences
# attention, states: they need texts, so without --text they read the 144 packaged sentences
DefaultTextOpt = Annotated[str, typer.Option("--text", help=_TEXT_HELP + " Default: the 144 packaged sentences.")]
ColumnOpt = Annotated[str | None, typer.Option("--column", help="Column of a .jsonl/.csv file with the texts.")]
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


def parse_int_list(text: str | None, what: str, allow_all: bool = True) -> list[int] | None:
    """'0,1,5' -> [0, 1, 5]; 'all' or None -> None (meaning every one). Bad text -> PosprobeError."""
    from posprobe.errors import PosprobeError

    if text is None or (allow_all and text.strip().lower() == "all"):
        return None
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise PosprobeError(
            f"--{what} '{text}' is not a comma-separated list of integers",
            f"write e.g. --{what} 0,1,5" + (" or --" + what + " all" if allow_all else ""),
        ) from err
    if not values:
        raise PosprobeError(f"--{what} is empty", f"write e.g. --{what} 0,1,5")
    return values


# SPEC §20: edits of a run (`posprobe.edits`), repeatable, all applied together
EditOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--edit",
        metavar="KIND:ARGS",
        help="Edit the model in every pass (repeatable; SPEC §20): head:L.H[=zero|=mean] (L, H take * and comma "
        "lists: head:21.8,18.6), attend:S,W (S sink tokens + a window of W), band:L.F (rotary pair F of layer L "
        "zeroed; F a range 0-7), rope-keep:P, shift:N (position ids + N), channel:L.C[=zero|=mean].",
        show_default=False,
    ),
]
