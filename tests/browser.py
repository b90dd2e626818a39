"""Headless Chromium for the report tests: open a page from a file with every request routed to a local recording
proxy, and return what the page logged on its console, the requests that left the browser, and its DOM or a
screenshot. Debian's `chromium` (`apt-get install chromium`; `.ci/run` installs it)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

# Chromium's own background traffic (network time, component updates, sign-in), made whatever the page holds.
# Chromium 150 also opens www.google.com:443 from a page of plain text (seen with no link or image on the page).
BROWSER_OWN_HOSTS = ("clients2.google.com", "update.googleapis.com", "redirector.gvt1.com", "accounts.google.com",
                     "www.google.com")  # fmt: skip

QUIET = [
    "--headless",
    "--no-sandbox",  # tests run as root in containers
    "--disable-gpu",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--no-pings",
    "--enable-logging=stderr",
    "--v=0",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Visit:
    console: list[str]  # the page's console messages (errors, CSP violations, logs)
    requests: list[str]  # request lines that reached the proxy, the browser's own traffic left out
    stdout: str  # --dump-dom: the DOM after load


class _RecordingProxy:
    """A proxy that answers nothing and records the first line of every request sent to it."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.running:
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    self.lines.append(conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1"))
                except OSError:
                    pass

    def close(self) -> list[str]:
        self.running = False
        self.thread.join()
        self.server.close()
        return self.lines


def visit(page: Path, tmp: Path, *, width: int = 1280, height: int = 1000, screenshot: Path | None = None) -> Visit:
    """Open `page` (a local file) in headless Chromium with the window `width` x `height`; `screenshot`: write a PNG
    there, else dump the DOM."""
    proxy = _RecordingProxy()
    action = [f"--screenshot={screenshot}"] if screenshot is not None else ["--dump-dom"]
    command = [chromium_path(), *QUIET, f"--user-data-dir={tmp / 'chromium-profile'}",
               f"--proxy-server=http://127.0.0.1:{proxy.port}", "--proxy-bypass-list=<-loopback>",
               f"--window-size={width},{height}", *action, page.resolve().as_uri()]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    finally:
        lines = proxy.close()
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    # a connection that sent nothing (Chromium's speculative pre-connects) is no request
    requests = [line for line in lines if line and not any(host in line for host in BROWSER_OWN_HOSTS)]
    return Visit(console, requests, done.stdout)
