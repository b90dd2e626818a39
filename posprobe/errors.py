"""The exception types posprobe raises for bad input; the CLI turns each into one line and exit code 2.

`PosprobeError` is the base. Bad arguments raise `ArgumentValueError` (also a `ValueError`) or
`ArgumentTypeError` (also a `TypeError`); both carry the name of the library argument (`layer`), and
their text may use `{arg}`, which the library renders as that name and the CLI as the flag (`--layer`), and
`{arg=VALUE}`, rendered `layer=VALUE` and `--layer VALUE`.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    """`text` without terminal colour codes (transformers and torch colour some of their messages)."""
    return _ANSI.sub("", text)


def first_line(err: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an exception's text (at most `limit` characters), ANSI escapes removed;
    its type name when it has no text. For quoting a library's error inside one line of ours."""
    lines = [line.strip() for line in strip_ansi(str(err)).strip().splitlines() if line.strip()]
    return lines[0][:limit] if lines else type(err).__name__


class PosprobeError(Exception):
    """A user-facing error: `message` says what is wrong, `hint` what to do about it."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self, cli: bool = False) -> str:
        """One line: message — hint (`cli` words argument names as command-line flags)."""
        message, hint = self.render_parts(cli)
        return f"{message} — {hint}" if hint else message

    def render_parts(self, cli: bool = False) -> tuple[str, str | None]:
        """(message, hint) as `render` words them (for the `--json` error object)."""
        return self.message, self.hint

    def __str__(self) -> str:
        return self.render(cli=False)


class ArgumentError(PosprobeError):
    """A bad value for argument `argument`. `{arg}` in message or hint is the argument's name in the library
    and `flag` (default `--` + name with dashes) on the command line."""

    def __init__(self, argument: str, message: str, hint: str | None = None, flag: str | None = None):
        super().__init__(message, hint)
        self.argument = argument
        self.flag = flag or "--" + argument.replace("_", "-")

    def render_parts(self, cli: bool = False) -> tuple[str, str | None]:
        """`{arg}` -> `--layer` (cli) or `layer`; `{arg=5}` -> `--layer 5` (cli) or `layer=5`."""

        def word(text: str) -> str:
            text = re.sub(r"\{arg=([^{}]*)\}", (rf"{self.flag} \1" if cli else rf"{self.argument}=\1"), text)
            return text.replace("{arg}", self.flag if cli else self.argument)

        return word(self.message), (word(self.hint) if self.hint else None)


class ArgumentValueError(ArgumentError, ValueError):
    """An argument of the right type with a value that cannot be used (out of range, unknown name)."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type (`layer='2'`, `blocks=128` where a list is expected)."""


class PosprobeWarning(UserWarning):
    """Something a user should know about a result that is still valid (the CLI prints it as a `note:` line)."""
