"""Benchmark: `posprobe report` vs running its commands one by one, and a re-run that reuses finished sections.

On the packaged all-MiniLM-L6-v2 with the report's defaults (`builtin:sentences`, 32 texts), in fresh processes:
- report: `posprobe report --force --out A` (every section run in one process);
- commands: the exact commands the report ran (from its report.json), each `posprobe ...` its own process, as a
  user without `report` would type them (the reference: the same work, no page);
- re-run: `posprobe report --out A` again (every section reused; reads the records and writes the page).
CPU seconds of the child processes (the machine is shared: wall time says more about the neighbours than about
posprobe), and wall seconds beside them; medians over `--repeats`.

    python benchmarks/bench_report.py [--repeats 1] [--model MODEL]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def cpu_of(commands: list[list[str]]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of running `commands` one after the other, each a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    for command in commands:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    posprobe = [sys.executable, "-m", "posprobe"]
    model = [args.model] if args.model else []
    rows: dict[str, list[tuple[float, float]]] = {"report": [], "commands": [], "re-run": []}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report"
        for _ in range(args.repeats):
            rows["report"].append(cpu_of([[*posprobe, "report", *model, "--force", "--out", str(out)]]))
            summary = json.loads((out / "report.json").read_text())
            commands = [shlex.split(s["command"])[1:] for s in summary["sections"].values() if s["status"] == "ok"]
            rows["commands"].append(cpu_of([[*posprobe, *c[:-3], "--out", str(Path(tmp) / "alone"), "--json"]
                                            for c in commands]))  # fmt: skip
            rows["re-run"].append(cpu_of([[*posprobe, "report", *model, "--out", str(out)]]))
        size = (out / "report.html").stat().st_size
    base = statistics.median(c for c, _ in rows["commands"])
    print(
        f"model: {args.model or 'all-MiniLM-L6-v2 (packaged)'}; sections run: {len(commands)}; page {size / 1e6:.2f} MB"
    )
    print("| run | CPU s | wall s | CPU / commands |\n|---|---:|---:|---:|")
    for name, values in rows.items():
        cpu, wall = statistics.median(c for c, _ in values), statistics.median(w for _, w in values)
        print(f"| {name} | {cpu:.1f} | {wall:.1f} | {cpu / base:.2f}× |")


if __name__ == "__main__":
    main()
