"""The one exception type posprobe raises for bad input; the CLI turns it into one line and exit code 2."""

from __future__ import annotations


class PosprobeError(Exception):
    """A user-facing error: `message` says what is wrong, `hint` what to do about it."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} — {self.hint}" if self.hint else self.message
