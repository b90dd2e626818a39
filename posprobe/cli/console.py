"""Where human output goes: rich on stderr, so that `--json` keeps stdout for exactly one JSON object."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

console = Console(stderr=True, highlight=False)


def emit_json(obj: Any) -> None:
    from posprobe.outputs import _json_default

    sys.stdout.write(json.dumps(obj, default=_json_default) + "\n")
    sys.stdout.flush()
