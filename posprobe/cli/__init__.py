"""The `posprobe` command line: a thin layer over the library.

Each command module registers its commands on `app`; `main()` is the one place that turns a
`PosprobeError` (or any unexpected failure, or Ctrl-C) into a single line on stderr and a non-zero exit
(with `--json`, also one JSON object `{"error", "hint", "exit_code"}` on stdout), and that discards what a failed
run wrote into output folders it created. Results go to stdout, progress and logs to stderr (`cli.console`).
Importing this package must stay light: no torch, transformers or matplotlib at import time.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from posprobe.cli.console import quiet_other_ranks, rank_prefix
from posprobe.errors import PosprobeError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a process stopped by Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM (kill, a job scheduler, a container stopping)
_INTERRUPTED = "interrupted (Ctrl-C) — no partial file was left; run the command again to finish it"
_TERMINATED = "terminated (SIGTERM) — no partial file was left; run the command again to finish it"


class _Terminated(BaseException):
    """Raised in the main thread on SIGTERM, so that every `finally` and cleanup runs as for Ctrl-C (the default
    action would end the process at once, leaving temporary files behind)."""


def _on_sigterm(signum, frame) -> None:
    raise _Terminated()


app = typer.Typer(
    name="posprobe",
    help="Measure, fit and retrofit positional mechanisms in pretrained transformers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        from posprobe.version import __version__

        print(f"posprobe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True),
    ] = False,
) -> None:
    """Measure, fit and retrofit positional mechanisms in pretrained transformers."""


def _flags_show_no_type() -> None:
    """`--help` lists a flag (`--json`, `--allow-pickle`, `--help`) without a type: typer's rich help showed
    `--json <bool>`, as if the flag took a value. One change to typer's option class here, so that every command
    (new ones too) inherits it."""
    import typer.core

    shown = typer.core.TyperOption.display_type_rich
    if getattr(shown, "_posprobe", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag and self.metavar is None else shown(self, ctx)

    display_type_rich._posprobe = True
    typer.core.TyperOption.display_type_rich = display_type_rich


def _register_commands() -> None:
    from posprobe.cli import (
        ablate,
        attention,
        context,
        finetune,
        fitting,
        learned,
        needle,
        retrofit,
        rotary,
        states,
        weights,
    )

    for module in (weights, fitting, retrofit, finetune, learned, attention, rotary, states, context, needle, ablate):
        module.register(app)
    from posprobe.cli import report  # `posprobe report` (issue 35), registered on its own line

    report.register(app)
    for command in app.registered_commands:
        if command.help is None and command.callback is not None:
            command.help = reflow_help(command.callback.__doc__ or "")


def reflow_help(doc: str) -> str:
    """A command's docstring as `--help` shows it: each paragraph on one line, for rich to wrap at the terminal's
    width (in rich markup mode typer keeps the source's line breaks, so a 116-column docstring line broke into a
    full line and a one-word line at 80-120 columns). Paragraphs stay apart; a line opening with '- ' keeps its own
    line (a list)."""
    import inspect

    paragraphs = []
    for paragraph in inspect.cleandoc(doc).split("\n\n"):
        lines: list[str] = []
        for line in paragraph.splitlines():
            if lines and not line.startswith("- "):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line.strip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


_flags_show_no_type()
_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, mapping errors to one line and an exit code.

    Exit codes: 0 success, 2 bad input (one `posprobe: error:` line), 130 interrupted (Ctrl-C), 143 terminated
    (SIGTERM: cleaned up as for Ctrl-C), 1 a bug.
    typer (which bundles its own click) turns Ctrl-C into `Exit(130)`, and with `standalone_mode=False`
    that exit code is *returned*, not raised: it must be read from the return value, or an interrupted
    run exits 0 in silence.
    """
    import signal
    import threading

    from posprobe.cli import console
    from posprobe.formats import writing as outputs

    global _json_mode
    _json_mode = console.json_requested(sys.argv[1:] if argv is None else list(argv))
    printed_to_stderr = console.console.stderr  # restored when the run ends: a later call in this process (a
    console.use_json_mode(_json_mode)  # notebook, a test) without --json prints its results on stdout again
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    outputs.begin_run()
    from posprobe.runtime.phases import reporting_phases

    quiet_other_ranks()  # under torchrun rank 0 alone prints (SPEC §19)
    try:
        with reporting_phases(console.show_phase):  # long steps say what they do (stderr, on a terminal)
            code = app(args=argv, standalone_mode=False)
    except PosprobeError as err:
        _fail(err.render(cli=True), 2, *err.render_parts(cli=True))
    except (KeyboardInterrupt, typer.Abort):
        _fail(_INTERRUPTED, EXIT_INTERRUPTED)
    except _Terminated:
        _fail(_TERMINATED, EXIT_TERMINATED)
    except SystemExit as err:
        if err.code not in (None, 0):
            outputs.discard_run()
        raise
    except Exception as err:  # usage errors (typer's bundled click) and genuine bugs
        if _is_usage_error(err):
            what, hint = _usage_parts(err)
            _fail(f"{what} — {hint}", 2, what, hint)
        if os.environ.get("POSPROBE_DEBUG"):
            outputs.discard_run()
            raise
        _fail(
            f"internal error: {type(err).__name__}: {err} — this is a bug in posprobe; please report it "
            "(POSPROBE_DEBUG=1 shows the traceback)",
            1,
        )
    else:
        if code == EXIT_INTERRUPTED:
            _fail(_INTERRUPTED, EXIT_INTERRUPTED)
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            outputs.discard_run()
            sys.exit(code)
    finally:
        outputs.end_run()
        console.use_json_mode(printed_to_stderr)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _is_usage_error(err: Exception) -> bool:
    """A click-style usage error (missing argument, bad value, unknown command): it knows how to show
    itself. typer bundles its own click, so match the interface rather than one class."""
    return callable(getattr(err, "show", None)) and isinstance(getattr(err, "exit_code", None), int)


def _usage_parts(err: Exception) -> tuple[str, str]:
    """A click usage error as (what is wrong, where to look: `posprobe COMMAND --help`)."""
    message = " ".join(str(err.format_message()).split()) if hasattr(err, "format_message") else str(err)
    message = message.replace("Value error, ", "").rstrip(".")  # pydantic-style wording inside click's choice error
    context = getattr(err, "ctx", None)
    command = getattr(context, "command_path", None) or "posprobe"
    return message, f"see `{command} --help`"


_json_mode = False  # this run was asked for `--json` (set by `main`)


def _fail(message: str, code: int, what: str | None = None, hint: str | None = None) -> None:
    """Discard the failed run's outputs, print one line on stderr, exit with `code`. Under `--json`, stdout also gets
    one object `{"error": what, "hint": hint, "exit_code": code}` (`what` defaults to the whole line), so a script
    always has something to parse."""
    from posprobe.formats import writing as outputs

    outputs.discard_run()
    print(f"posprobe: error: {rank_prefix()}{message}", file=sys.stderr, flush=True)
    from posprobe.runtime.distributed import is_main_process

    if _json_mode and is_main_process():  # under torchrun one object on stdout, from rank 0
        import json

        record = {"error": what if what is not None else message, "hint": hint, "exit_code": code}
        print(json.dumps(record, ensure_ascii=False), file=sys.stdout, flush=True)
    sys.exit(code)
