"""The `posprobe` command line: a thin layer over the library.

Each command module registers its commands on `app`; `main()` is the one place that turns a
`PosprobeError` (or any unexpected failure) into a single line on stderr and a non-zero exit.
Importing this package must stay light: no torch, transformers or matplotlib at import time.
"""

from __future__ import annotations

import os
import sys

import typer

from posprobe.errors import PosprobeError

app = typer.Typer(
    name="posprobe",
    help="Measure, fit and retrofit positional mechanisms in pretrained transformers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _register_commands() -> None:
    from posprobe.cli import analysis, attention, finetune, fitting, retrofit

    for module in (analysis, fitting, retrofit, finetune, attention):
        module.register(app)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, mapping errors to one line and exit code 2."""
    try:
        app(args=argv, standalone_mode=False)
    except PosprobeError as err:
        _fail(err.render(cli=True), 2)
    except typer.Abort:
        _fail("aborted", 130)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except SystemExit:
        raise
    except Exception as err:  # usage errors (typer's bundled click) and genuine bugs
        if _is_usage_error(err):
            err.show()
            sys.exit(2)
        if os.environ.get("POSPROBE_DEBUG"):
            raise
        _fail(
            f"internal error: {type(err).__name__}: {err} — this is a bug in posprobe; please report it "
            "(POSPROBE_DEBUG=1 shows the traceback)",
            1,
        )
    else:
        return


def _is_usage_error(err: Exception) -> bool:
    """A click-style usage error (missing argument, bad value, unknown command): it knows how to show
    itself. typer bundles its own click, so match the interface rather than one class."""
    return callable(getattr(err, "show", None)) and isinstance(getattr(err, "exit_code", None), int)


def _fail(message: str, code: int) -> None:
    print(f"posprobe: error: {message}", file=sys.stderr)
    sys.exit(code)
