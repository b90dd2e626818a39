"""`posprobe attention`'s profile pages against the measurement they illustrate (issue 19: "attention spends 23 s
writing figures after 11 s of measuring").

One process: the packaged SmolLM2-135M-Instruct (30 layers x 9 heads, Q4_1 GGUF) measured on the first `--texts`
sentences of tests/data/sentences.txt (`posprobe.attention_profiles`, max length 128: load, forward passes,
reducers, weights-based profiles), then its 30 profile pages written twice: by `ProfilePages.write` (the layout
drawn once, each page redrawing only its lines, scales and titles; what `posprobe attention` writes), and by
matplotlib's own `savefig` of the same page's Figure (every artist drawn for every page). CPU seconds
(`time.process_time`), medians of `--repeats`. With `--before SRC` (a tree from `git archive REV posprobe`), the
same pages are also written by that tree's code in a child process.

    python benchmarks/bench_attention_pages.py [--texts 50] [--repeats 3] [--before SRC]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

CHILD = """
import sys, time, tempfile
sys.path.insert(0, {tests!r})
import posprobe
from posprobe.plotting import attention as pa
from real_texts import real_sentences
assert not hasattr(pa, "attention_pages"), posprobe.__file__  # the code before, not this tree's
r = posprobe.attention_profiles("SmolLM2-135M-Instruct", real_sentences({texts}), max_length=128)
out = tempfile.mkdtemp()
times = []
for _ in range({repeats}):
    start = time.process_time()
    for layer in range(r.n_layers):
        pa.profile_grid(r, layer).savefig(f"{{out}}/p{{layer}}.png", dpi=110)
    times.append(time.process_time() - start)
print(sorted(times)[len(times) // 2])
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", default=None, help="a source tree of the code before (git archive REV posprobe)")
    args = parser.parse_args()
    from real_texts import real_sentences

    import posprobe
    from posprobe.plotting import attention as pa

    start = time.process_time()
    result = posprobe.attention_profiles("SmolLM2-135M-Instruct", real_sentences(args.texts), max_length=128)
    measure = time.process_time() - start
    out = Path(tempfile.mkdtemp())
    fast, plain = [], []
    for _ in range(args.repeats):
        start = time.process_time()
        pages = pa.attention_pages(result)
        for layer in range(result.n_layers):
            pages.write(layer, out / f"fast{layer}.png")
        fast.append(time.process_time() - start)
        start = time.process_time()
        for layer in range(result.n_layers):
            pa.attention_pages(result).figure(layer).savefig(out / f"plain{layer}.png", dpi=110)
        plain.append(time.process_time() - start)
    rows = [("measurement (attention_profiles)", measure), ("30 pages, ProfilePages.write", statistics.median(fast)),
            ("30 pages, savefig of each Figure", statistics.median(plain))]  # fmt: skip
    if args.before:
        code = CHILD.format(tests=str(ROOT / "tests"), texts=args.texts, repeats=args.repeats)
        env = {**os.environ, "PYTHONPATH": args.before}
        done = subprocess.run(  # cwd: `python -c` puts the working folder first on sys.path, before PYTHONPATH
            [sys.executable, "-c", code], env=env, cwd=args.before, capture_output=True, text=True, check=True
        )
        rows.append(("30 pages, the code before (--before)", float(done.stdout.strip().splitlines()[-1])))
    for name, seconds in rows:
        print(f"{name:40s} {seconds:7.2f} s CPU   {seconds / measure:5.2f}x the measurement")


if __name__ == "__main__":
    main()
