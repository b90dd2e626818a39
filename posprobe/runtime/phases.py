"""Named phases of long work ("reading the weights of X", "fitting the position probes"), for a front end to show.

The library calls `phase(message)` where a step that can take seconds begins; nothing happens unless a listener is
installed with `reporting_phases(callback)` (the CLI installs one for every command: a line on stderr when it is a
terminal). Progress *within* a phase (texts done) stays with each function's `progress` callback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_listener: ContextVar[Callable[[str], None] | None] = ContextVar("posprobe_phase_listener", default=None)


def phase(message: str) -> None:
    """Say that a step begins (`message`: what it does, lower case, no final full stop)."""
    listener = _listener.get()
    if listener is not None:
        listener(message)


@contextmanager
def reporting_phases(callback: Callable[[str], None]) -> Iterator[None]:
    """Within the block, every `phase(message)` calls `callback(message)`."""
    token = _listener.set(callback)
    try:
        yield
    finally:
        _listener.reset(token)
