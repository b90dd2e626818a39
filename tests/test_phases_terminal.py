"""Long work is never silent on a terminal (issue 49): `posprobe states` run in a pseudo-terminal (the pty module,
so that the progress bars and phase lines show as a user sees them) prints something new at least every
`SILENCE` seconds from start to end, and names the probe fitting per hidden state."""

from __future__ import annotations

import os
import re
import select
import sys
import time

import pytest

SILENCE = 15.0  # seconds: the longest a terminal may go without a new line or a progress update


def run_in_terminal(args: list[str], timeout: float = 600) -> tuple[str, float, int]:
    """Run `python -m posprobe *args` in a pseudo-terminal: (everything it printed, escape codes removed; the
    longest time between two outputs, start and end included; the exit status)."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal is its stdin, stdout and stderr
        os.execvpe(sys.executable, [sys.executable, "-m", "posprobe", *args], dict(os.environ, COLUMNS="120"))
    start = last = time.monotonic()
    longest, out = 0.0, b""
    while time.monotonic() - start < timeout:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        now = time.monotonic()
        longest, last, out = max(longest, now - last), now, out + chunk
    _, status = os.waitpid(pid, 0)
    longest = max(longest, time.monotonic() - last)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))
    return text, longest, os.waitstatus_to_exitcode(status)


@pytest.mark.slow
def test_states_on_a_terminal_is_never_silent_for_long(tmp_path):
    """The packaged MiniLM on 100 packaged sentences (the issue's run: the bar sat at 100/100 for most of it while
    the probes were fitted): a new line or bar update at least every 15 s, and one phase line per probed hidden
    state."""
    text, longest, status = run_in_terminal(["states", "--max-texts", "100", "--out", str(tmp_path / "out")])
    assert status == 0, text[-2000:]
    for k in range(7):
        assert f"fitting the position probes: hidden state {k} of 6" in text
    assert "writing states.npz" in text
    assert longest < SILENCE, f"silent for {longest:.1f} s"
