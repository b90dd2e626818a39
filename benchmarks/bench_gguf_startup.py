"""Start-up of GGUF commands: how long `posprobe` takes to answer (or refuse) on a GGUF file (issue 31, item 4).

    python benchmarks/bench_gguf_startup.py --before SRC [--repeats 3] [--model SmolLM2-135M-Instruct]

`SRC` holds the code before the change (`git archive <commit> posprobe | tar -x -C SRC`), which built the config
through transformers' `load_gguf_checkpoint(..., return_tensors=False)` (gguf's `GGUFReader` parsing the whole
header again, a numpy view per vocabulary entry) and loaded a model before refusing `retrofit`. Each command runs in
a fresh process (imports included, what a user waits for); wall and CPU seconds (user + system of the child) are
medians over `--repeats`. Three ways:

- before: the code in SRC;
- now, cold: this checkout with the config cache off (`POSPROBE_CACHE_DIR=off`): the config from posprobe's own
  parsed header through transformers' key table and config class (imports torch);
- now, cached: this checkout with a warm cache (what every run after the first on a file sees);
- before, cached (`--before-cached`): the code in SRC with the same warm cache (where SRC has the cache too).

The commands: `params MODEL` (config only), `toeplitz MODEL` (refused: rotary), `retrofit MODEL --mechanism fixed`
(refused: Llama), `fhat MODEL --layer 99` and `profiles MODEL --layers 99` (refused: no such layer; before the name
map became lazy these built transformers' GGUF tensor-name map, importing its loader and the model class, first).
Their stdout and stderr must be the same every way (checked).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str], code_root: Path, cache: str, cwd: Path) -> tuple[float, float, str]:
    """(wall s, child CPU s, stdout + stderr) of `python -m posprobe ARGS` with `code_root` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(code_root), "POSPROBE_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "posprobe", *args], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, f"rc={done.returncode}\n{done.stdout}{done.stderr}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="folder holding the code before (posprobe/)")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before-cached", action="store_true", help="also the code before with the warm cache")
    options = parser.parse_args()
    commands = {
        "params": ["params", options.model],
        "toeplitz (refused)": ["toeplitz", options.model],
        "retrofit fixed (refused)": ["retrofit", options.model, "--mechanism", "fixed", "--out", "never"],
        "fhat --layer 99 (refused)": ["fhat", options.model, "--layer", "99", "--out", "never"],
        "profiles --layers 99 (refused)": ["profiles", options.model, "--layers", "99", "--out", "never"],
    }
    with tempfile.TemporaryDirectory() as tmp:
        cwd, cache = Path(tmp), str(Path(tmp) / "cache")
        run(commands["params"], ROOT, cache, cwd)  # fills the cache for the 'cached' way
        ways = {"before": (options.before, "off"), "now, cold": (ROOT, "off"), "now, cached": (ROOT, cache)}
        if options.before_cached:
            ways = {
                "before": (options.before, "off"),
                "before, cached": (options.before, cache),
                **dict(list(ways.items())[1:]),
            }
        print("| command | way | wall s | CPU s | CPU / before |\n|---|---|---:|---:|---:|")
        for name, args in commands.items():
            outputs, cpu_before = {}, None
            for way, (code_root, cache_dir) in ways.items():
                times = [run(args, code_root, cache_dir, cwd) for _ in range(options.repeats)]
                wall = statistics.median(t[0] for t in times)
                cpu = statistics.median(t[1] for t in times)
                outputs[way] = {t[2] for t in times}
                cpu_before = cpu if cpu_before is None else cpu_before
                print(f"| `{name}` | {way} | {wall:.2f} | {cpu:.2f} | {cpu / cpu_before:.2f}× |", flush=True)
            distinct = set().union(*outputs.values())
            if len(distinct) != 1:
                raise SystemExit(f"{name}: the outputs differ between the ways:\n" + "\n---\n".join(distinct))


if __name__ == "__main__":
    main()
