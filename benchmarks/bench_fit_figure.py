"""Wall time of `posprobe fit-tisa` against `posprobe profiles --layers all` on a GPT-2-medium-sized model.

The fit figure used to cost time quadratic in its panels (matplotlib shared-axes bookkeeping): 137 s for
`fit-tisa` on 24 layers x 16 heads = 384 heads, of which the fit was 11 s. Target: `fit-tisa` wall <= 2x
`profiles --layers all` wall on that model (both compute every head's profile; `profiles` also draws 24
figures of 16 panels, `fit-tisa` fits 384 heads and draws one figure of 384 panels).

    python benchmarks/bench_fit_figure.py [--repeats 3]

The checkpoint is built here: `GPT2Config(n_layer=24, n_head=16, n_embd=1024)` (GPT-2 medium's shape),
random weights (`torch.manual_seed(0)`), saved with `save_pretrained` into a temporary folder. Each command
runs in a fresh process, as a user runs it (`--json`, outputs written); medians of interleaved runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_model(folder: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=24, n_head=16, n_embd=1024, n_positions=1024, vocab_size=50257)
    GPT2Model(config).save_pretrained(folder)


def timed(args: list[str]) -> tuple[float, dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "posprobe", *args, "--json"], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {done.stderr}")
    return wall, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "gpt2-medium-random"
        build_model(model)
        walls: dict[str, list[float]] = {"profiles": [], "fit-tisa": []}
        fit_seconds = []
        for _ in range(opts.repeats):
            wall, _ = timed(["profiles", str(model), "--layers", "all", "--out", str(Path(tmp) / "profiles")])
            walls["profiles"].append(wall)
            wall, record = timed(["fit-tisa", str(model), "--out", str(Path(tmp) / "fit")])
            walls["fit-tisa"].append(wall)
            fit_seconds.append(record["seconds"])
        p, f = statistics.median(walls["profiles"]), statistics.median(walls["fit-tisa"])
        print(
            "| model | heads | `profiles --layers all` wall (s) | `fit-tisa` wall (s) | of which fitting (s) | ratio |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        print(
            f"| GPT-2-medium-sized, random (24 x 16) | 384 | {p:.1f} | {f:.1f} | "
            f"{statistics.median(fit_seconds):.1f} | **{f / p:.2f}x** |"
        )
        print(f"runs: profiles {walls['profiles']}, fit-tisa {walls['fit-tisa']}")


if __name__ == "__main__":
    main()
