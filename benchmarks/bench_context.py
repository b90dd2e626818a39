"""Benchmark: `posprobe.context` (loss by position, SPEC §17) vs a plain transformers forward with `labels=` over the
same windows, at window lengths 512..4096 on the packaged SmolLM2-135M-Instruct.

The GGUF is converted once to a float32 safetensors folder (under /tmp) so that each fresh process loads it in
seconds. Windows: the King James Bible (builtin:kjv) tokenized once, joined with EOS, cut as SPEC §17 says (the
same windows on both sides). For each length, one fresh process per side (so each peak is its own):
- baseline: `model(input_ids=window, labels=window, use_cache=False).loss` per window (transformers' float32
  cross-entropy: one number per window);
- posprobe: `posprobe.context(model, [L], documents=..., windows=N)` on the loaded model (the variant 'none'):
  the same forward without labels, then the loss at every position from the logits (the float32 log-sum-exp of
  each position, the loss and its sums in float64).
Each process loads the model, resets the kernel's resident high-water mark (/proc/self/clear_refs), runs one
warm-up window, then times N windows (wall and CPU seconds) and reports VmHWM - VmRSS before the run (the peak
memory the run adds). Sides alternate; each length is measured `--repeats` times; medians are reported.

    python benchmarks/bench_context.py [--lengths 512,1024,2048,4096] [--windows 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_states import smollm2_folder  # noqa: E402  (the packaged SmolLM2 as a float32 folder, made once)


def documents(folder: str, tokens: int) -> list[list[int]]:
    """KJV books tokenized (no special tokens) until they hold `tokens` tokens."""
    from transformers import AutoTokenizer

    from posprobe.texts.reading import iter_texts

    tokenizer = AutoTokenizer.from_pretrained(folder)
    out, total = [], 0
    for book in iter_texts("builtin:kjv"):
        out.append(tokenizer(book, add_special_tokens=False)["input_ids"])
        total += len(out[-1]) + 1
        if total >= tokens:
            return out
    return out


def _mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def measure(side: str, folder: str, length: int, windows: int) -> dict:
    """In this process: load, warm up, reset the peak, run `windows` windows of `length` one way; seconds and MiB."""
    import torch
    from transformers import AutoModelForCausalLM

    import posprobe
    from posprobe.analysis.context_loss import cut_windows

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    docs = documents(folder, (windows + 1) * length + 1000)
    stream = [x for i, d in enumerate(docs) for x in ([model.config.eos_token_id] if i else []) + d]
    ids = torch.as_tensor(cut_windows(stream, length, windows + 1))  # SmolLM2's tokenizer adds no BOS

    def baseline(rows):
        total = 0.0
        with torch.inference_mode():
            for row in rows:
                x = row[None]
                total += model(input_ids=x, labels=x, use_cache=False).loss.item()
        return total

    def ours(rows):
        return posprobe.context(model, [length], documents=[list(map(int, rows.flatten()))], windows=len(rows))

    run = baseline if side == "baseline" else ours
    run(ids[:1])  # warm-up: one window
    rows = ids[1:]
    before = _mib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    start, cpu = time.perf_counter(), time.process_time()
    run(rows)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"wall": wall, "cpu": cpu, "peak_added_mib": _mib("VmHWM") - before}


def in_fresh_process(side: str, folder: str, length: int, windows: int) -> dict:
    code = "import sys, json; sys.path.insert(0, sys.argv[1]); from benchmarks.bench_context import measure; " \
        "print(json.dumps(measure(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))"  # fmt: skip
    args = [str(ROOT), side, folder, str(length), str(windows)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,1024,2048,4096")
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    folder = smollm2_folder()
    lengths = [int(x) for x in args.lengths.split(",")]
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"SmolLM2-135M float32, {args.windows} windows per length, {args.repeats} repeats", flush=True)  # fmt: skip
    print("| L | baseline wall s | context wall s | wall ratio | baseline CPU s | context CPU s | CPU ratio | "
          "baseline peak MiB | context peak MiB |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for length in lengths:
        runs = {"baseline": [], "context": []}
        for _ in range(args.repeats):
            for side in ("baseline", "context"):
                runs[side].append(in_fresh_process(side, folder, length, args.windows))
        med = {s: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for s, rs in runs.items()}
        b, c = med["baseline"], med["context"]
        print(f"| {length:,} | {b['wall']:.2f} | {c['wall']:.2f} | {c['wall'] / b['wall']:.3f} | {b['cpu']:.2f} | "
              f"{c['cpu']:.2f} | {c['cpu'] / b['cpu']:.3f} | {b['peak_added_mib']:.0f} | {c['peak_added_mib']:.0f} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
