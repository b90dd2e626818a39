"""Every number of README commands before and after a change (issue 45): run each command with `--json --out` in
two source trees (their posprobe on PYTHONPATH, the same venv and packaged models) and compare the JSON records
(timings and output paths left out) and every array of every .npz they wrote, bit for bit (NaN equal to NaN).

    git archive <branch-point> | tar -x -C /tmp/base
    python benchmarks/compare_outputs.py --base /tmp/base --head . --work /tmp/compare

Prints one line per command (same / DIFFERENT and where) and exits 1 when any command differs or failed in one tree
only. The command list is small sizes of the README's commands, on the packaged MiniLM and the SmolLM2 GGUF.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

SMOL = "SmolLM2-135M-Instruct"
TEXTS = ["--max-texts", "8", "--max-length", "32"]
COMMANDS: list[list[str]] = [
    ["attention", *TEXTS],
    ["attention", "--exclude-special", "--max-texts", "8", "--max-length", "24", "--batch-size", "3"],
    ["attention", SMOL, "--max-texts", "4", "--max-length", "32"],
    ["attention", SMOL, "--max-texts", "4", "--max-length", "32", "--block-size", "8"],
    ["attention", "--max-texts", "6", "--max-length", "32", "--block-size", "8"],
    ["states", "--max-texts", "16", "--max-length", "32"],
    ["states", SMOL, "--max-texts", "8", "--max-length", "32", "--min-texts", "8"],
    ["rotary", SMOL, "--positions", "32"],
    ["rotary", SMOL, "--text", "builtin:sentences", "--max-texts", "4", "--max-length", "32"],
    ["profiles", "--positions", "32"],
    ["profiles", SMOL, "--layers", "0,15,29", "--positions", "32"],
    ["profiles", "--text", "builtin:sentences", "--max-texts", "8", "--max-length", "32", "--min-texts", "4"],
    ["fhat", "--positions", "32"],
    ["fhat", SMOL, "--layer", "3", "--positions", "32"],
    ["fhat", "--text", "builtin:sentences", "--max-texts", "8", "--max-length", "32", "--min-texts", "4"],
    ["toeplitz"],
    ["fit-tisa", "--positions", "32"],
    ["params"],
    ["context", SMOL, "--lengths", "32,64", "--windows", "2"],
    ["context", SMOL, "--lengths", "32,64", "--windows", "2", "--rope-scaling", "none,linear:2", "--batch-size", "2"],
    ["needle", SMOL, "--lengths", "160,200", "--depths", "0,1", "--trials", "1"],
    [
        "needle",
        SMOL,
        "--lengths",
        "160",
        "--depths",
        "0.5",
        "--trials",
        "2",
        "--needle",
        " The secret city is {answer}.",
        "--answer",
        "Paris",
        "--question",
        " What is the secret city?",
    ],  # fmt: skip
]
IGNORED = {"seconds", "npz", "figures", "out", "elapsed", "time", "files"}  # timings and where files went
ALLOW_ADDED = False  # --allow-added: keys and arrays only in the head are listed apart, not counted as differences
ADDED: set[str] = set()


def run(tree: Path, command: list[str], out: Path) -> tuple[int, dict | None, str]:
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    proc = subprocess.run(
        [sys.executable, "-m", "posprobe", *command, "--json", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
    )
    try:
        record = json.loads(proc.stdout)
    except json.JSONDecodeError:
        record = None
    return proc.returncode, record, proc.stderr.strip().splitlines()[-1:] and proc.stderr.strip().splitlines()[-1]


def json_diff(a, b, where: str = "") -> list[str]:
    """Paths where two JSON values differ (keys in IGNORED skipped, strings naming the output folders skipped)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if key in IGNORED:
                continue
            if key not in a and ALLOW_ADDED:
                ADDED.add(f"{where}.{key}")  # a value the head added (a later issue's), not a changed one
            elif key not in a or key not in b:
                out.append(f"{where}.{key} (only in {'head' if key in b else 'base'})")
            else:
                out += json_diff(a[key], b[key], f"{where}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where} (lengths {len(a)} / {len(b)})"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in json_diff(x, y, f"{where}[{i}]")]
    if isinstance(a, str) and isinstance(b, str) and ("/base/" in a or "/head/" in a):
        return []  # a path into this run's output folders
    return [] if a == b else [where or "."]


def npz_diff(base: Path, head: Path) -> list[str]:
    """Names of the arrays that differ between every .npz under `base` and its namesake under `head`."""
    out = []
    files = sorted(p.relative_to(base) for p in base.rglob("*.npz"))
    others = sorted(p.relative_to(head) for p in head.rglob("*.npz"))
    if files != others:
        return [f"npz files {files} / {others}"]
    for name in files:
        with np.load(base / name, allow_pickle=False) as a, np.load(head / name, allow_pickle=False) as b:
            only_head = set(b.files) - set(a.files)
            if ALLOW_ADDED:
                ADDED.update(f"{name}:{key}" for key in only_head)
            if set(a.files) - set(b.files) or (only_head and not ALLOW_ADDED):
                out.append(f"{name}: arrays {sorted(set(a.files) ^ set(b.files))}")
                continue
            for key in a.files:
                x, y = a[key], b[key]
                if key == "metadata":  # the JSON metadata, less the arrays' dimension names (`formats.arrays`)
                    meta = [{k: v for k, v in json.loads(str(m)).items() if k != "dims"} for m in (x, y)]
                    out += [f"{name}:metadata{d}" for d in json_diff(*meta)]
                    continue
                same = (
                    x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind in "fc")
                )
                if not same:
                    out.append(f"{name}:{key}")
    return out


def compare(args, index: int) -> tuple[bool, int, str]:
    """(differs, arrays compared, the line to print) of command `index`, run in both trees."""
    command = COMMANDS[index]
    outs = {name: args.work / name / str(index) for name in ("base", "head")}
    base = run(args.base, command, outs["base"])
    head = run(args.head, command, outs["head"])
    label = f"{index:2d} posprobe {' '.join(command)}"
    if base[0] != head[0] or base[0] != 0:
        return base[0] != head[0], 0, f"{label}: exit {base[0]} / {head[0]} ({base[2]} / {head[2]})"
    diffs = json_diff(base[1], head[1]) + npz_diff(outs["base"], outs["head"])
    count = sum(len(np.load(p).files) for p in outs["head"].rglob("*.npz"))
    return bool(diffs), count, f"{label}: {'DIFFERENT ' + ', '.join(diffs[:8]) if diffs else f'same ({count} arrays)'}"


def main() -> int:
    from concurrent.futures import ThreadPoolExecutor

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--head", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--only", type=int, nargs="*", help="command numbers to run (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="commands run at once (each runs base and head in turn)")
    parser.add_argument(
        "--allow-added",
        action="store_true",
        help="keys and arrays only in the head (added by later work) are listed, not differences",
    )
    args = parser.parse_args()
    global ALLOW_ADDED
    ALLOW_ADDED = args.allow_added
    indices = [i for i in range(len(COMMANDS)) if not args.only or i in args.only]
    failures = arrays = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for differs, count, line in pool.map(lambda i: compare(args, i), indices):
            failures += differs
            arrays += count
            print(line, flush=True)
    print(f"{len(indices)} commands, {arrays} arrays compared, {failures} different")
    if ADDED:
        print(f"only in the head (added, not compared): {', '.join(sorted(ADDED))}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
