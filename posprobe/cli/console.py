"""Where human output goes: rich on stderr, so that `--json` keeps stdout for exactly one JSON object."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Any

from rich.console import Console

from posprobe.results import middle_ellipsis  # noqa: F401  (re-exported for the commands)

console = Console(stderr=True, highlight=False)
# Off a terminal (a pipe, a log file, CI) lines are not wrapped, so a long path stays one line a script can read.
console.soft_wrap = not console.is_terminal


def quiet_other_ranks() -> None:
    """Under torchrun, silence every rank but 0 (SPEC §19: rank 0 alone prints; errors still reach stderr)."""
    from posprobe.distributed import is_main_process

    if not is_main_process():
        console.quiet = True


def rank_prefix() -> str:
    """'rank R: ' for an error line under torchrun (world size > 1), '' in a plain run."""
    from posprobe.distributed import rank_and_world

    rank, world = rank_and_world()
    return f"rank {rank}: " if world > 1 else ""


def emit_json(obj: Any) -> None:
    from posprobe.outputs import _json_default

    if console.quiet:
        return

    sys.stdout.write(json.dumps(obj, default=_json_default) + "\n")
    sys.stdout.flush()


@contextmanager
def progress_reporter(description: str):
    """A progress bar on stderr for long work, yielding a `progress(stage, done, total)` callback.

    Drawn only when stderr is a terminal (rich writes nothing live otherwise, and the bar is transient),
    so pipes and logs get no ANSI codes and no stray lines."""
    if not console.is_terminal or console.quiet:
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} heads"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, int] = {}

        def report(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(f"{description}, {stage}", total=total)
            bar.update(tasks[stage], completed=done)

        yield report


@contextmanager
def text_progress(total: int | None):
    """A progress bar over texts on stderr, yielding an `advance(k)` callback (k texts more done).

    Drawn only when stderr is a terminal: rich's live display, even transient, ends with a blank line on a pipe or
    a log file, so off a terminal the callback does nothing and nothing at all is written."""
    if not console.is_terminal or console.quiet:
        yield lambda k: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("texts"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task("texts", total=total)
        yield lambda k: bar.advance(task, k)


UNDEFINED_R2 = "undefined (constant matrix)"
UNDEFINED_MARK = "—"


def format_r2(value, digits: int = 4, short: bool = False) -> str:
    """An R² for text output (`posprobe.analysis.toeplitz.format_r2`); in a table cell (`short`) an undefined
    one reads "—" (print `undefined_note()` under the table)."""
    from posprobe.analysis.toeplitz import format_r2 as library_format

    text = library_format(value, digits)
    return UNDEFINED_MARK if short and text == UNDEFINED_R2 else text


def any_undefined(values) -> bool:
    """Whether any R² in `values` (numbers, None or NaN) is undefined."""
    return any(v is None or v != v for v in values)


def print_undefined_note() -> None:
    console.print(f"[dim]{UNDEFINED_MARK} = R² {UNDEFINED_R2}: the total sum of squares is zero[/dim]")
