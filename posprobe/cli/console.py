"""Where output goes: results (tables, paths of what was written) on stdout through `console`; progress, status
lines and logs on stderr through `log_console`. Under `--json` (`use_json_mode`) stdout carries exactly one JSON
object, so `console` moves to stderr too.

`posprobe toeplitz > r.txt` keeps the table; `posprobe toeplitz 2> /dev/null` hides only the progress."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Any

from rich.console import Console

from posprobe.results import middle_ellipsis  # noqa: F401  (re-exported for the commands)


class ResultConsole(Console):
    """The results console: a table too wide for the console is narrowed column by column, never below its longest
    word, so headers wrap at spaces instead of being cut ('unifo…' in three of the sinks table's headers, issue
    49); where even that does not fit, off a terminal (a file, a pipe) it keeps the width its words need. Off a
    terminal a table's title is a line of its own, whole (rich wrapped a title longer than its table)."""

    def print(self, *objects, **kwargs) -> None:
        from rich.table import Table

        if len(objects) != 1 or not isinstance(objects[0], Table) or "width" in kwargs:
            return super().print(*objects, **kwargs)
        table, width = fitted_table(self, objects[0], split_title=not self.is_terminal)
        if table.title is None and objects[0].title is not None:
            super().print(objects[0].title, soft_wrap=True, style=objects[0].title_style or "table.title")
        if width is None or self.is_terminal:
            return super().print(table, **kwargs)
        kept = self._width
        self.width = width  # print() renders at most self.width
        try:
            return super().print(table, **kwargs)
        finally:
            self._width = kept


def fitted_table(target: Console, table, split_title: bool = False):
    """(a copy of `table` whose columns fit `target`'s width without cutting a word, the width it needs where its
    words alone are wider than the console, else None). Each step narrows the column with the most room above its
    longest word (rich's own narrowing cut headers below it); with `split_title` the copy has no title."""
    from copy import copy

    fitted = copy(table)
    fitted.columns = [copy(column) for column in table.columns]
    if split_title:
        fitted.title = None
    options = target.options
    ranges = [fitted._measure_column(target, options.update_width(100_000), c) for c in fitted.columns]
    widths, floors = [r.maximum for r in ranges], [r.minimum for r in ranges]
    room = target.width - fitted._extra_width
    excess = sum(widths) - room
    if excess <= 0:
        return fitted, None
    while excess > 0:
        slack, index = max((w - f, i) for i, (w, f) in enumerate(zip(widths, floors)))
        if slack <= 0:
            break
        widths[index] -= 1
        excess -= 1
    for index, column in enumerate(fitted.columns):
        if column.width is None:
            column.width = widths[index] - fitted._get_padding_width(index)
    return fitted, (sum(widths) + fitted._extra_width if excess > 0 else None)


console = ResultConsole(highlight=False)  # results: stdout (sys.stdout at print time, so captured output sees it)
log_console = Console(stderr=True, highlight=False)  # progress bars, status spinners, logs: stderr
# Off a terminal (a pipe, a log file, CI) lines are not wrapped, so a long path stays one line a script can read.
console.soft_wrap = not console.is_terminal
log_console.soft_wrap = not log_console.is_terminal


def use_json_mode(enabled: bool) -> None:
    """With `--json`, stdout holds one JSON object and nothing else: results printed through `console` (there
    should be none) go to stderr instead. Called once per run by `posprobe.cli.main`."""
    console.stderr = enabled
    console.soft_wrap = not console.is_terminal


def json_requested(argv: list[str]) -> bool:
    """Whether a command line asks for `--json` (before `--`, where options end)."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def show_phase(message: str) -> None:
    """A phase of long work (`posprobe.runtime.phases.phase`) as one dim line on stderr — only on a terminal, like the
    progress bars, so that pipes and logs stay as they were."""
    if log_console.is_terminal:
        from rich.text import Text

        log_console.print(Text(f"{message}…", style="dim"))  # Text: a name with [brackets] is not markup


def quiet_other_ranks() -> None:
    """Under torchrun, silence every rank but 0 (SPEC §19: rank 0 alone prints; errors still reach stderr)."""
    from posprobe.runtime.distributed import is_main_process

    if not is_main_process():
        console.quiet = True
        log_console.quiet = True


def rank_prefix() -> str:
    """'rank R: ' for an error line under torchrun (world size > 1), '' in a plain run."""
    from posprobe.runtime.distributed import rank_and_world

    rank, world = rank_and_world()
    return f"rank {rank}: " if world > 1 else ""


def emit_json(obj: Any) -> None:
    """`obj` as one line of standard JSON on stdout: a non-finite float (NaN, Infinity) is written null."""
    from posprobe.formats.writing import json_standard

    if console.quiet:
        return

    sys.stdout.write(json.dumps(json_standard(obj), allow_nan=False) + "\n")
    sys.stdout.flush()


@contextmanager
def progress_reporter(description: str):
    """A progress bar on stderr for long work, yielding a `progress(stage, done, total)` callback.

    Drawn only when stderr is a terminal (rich writes nothing live otherwise, and the bar is transient),
    so pipes and logs get no ANSI codes and no stray lines."""
    if not log_console.is_terminal or log_console.quiet:
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} heads"),
        TimeElapsedColumn(),
        console=log_console,
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
    if not log_console.is_terminal or log_console.quiet:
        yield lambda k: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("texts"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=log_console,
        transient=True,
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
