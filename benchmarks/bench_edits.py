"""Benchmark: the cost of an edit (SPEC §20) on `posprobe.context`, as a paired ratio edited / unedited, on the
packaged SmolLM2-135M-Instruct (converted once to a float32 folder under /tmp, `bench_states.smollm2_folder`).

One process loads the model once, tokenizes the King James Bible once, then for each repeat runs the unedited
`posprobe.context(model, [L], documents=..., windows=N)` and, right after it, the same call with one edit, for each
edit in turn (A B A C A D ...): each edited run is paired with the unedited run just before it, and the ratio of
their wall times (and of their process CPU times: on a loaded shared machine the figure to read) is taken pair by
pair; medians (and min-max) over the repeats are reported. One warm-up of every
side first. `=mean` edits make a first pass over the same windows for their means (SPEC §20): their expected cost
is about 2x; the others run in one pass.

    OMP_NUM_THREADS=1 python benchmarks/bench_edits.py [--length 512] [--windows 2] [--repeats 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_context import documents  # noqa: E402
from bench_states import smollm2_folder  # noqa: E402

EDITS = ["head:21.8", "head:18.6,17.3,17.4,18.7,6.0", "attend:4,60", "attend:0,64", "band:*.0", "rope-keep:0.5",
         "shift:1000", "channel:*.0", "head:21.8=mean"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--edits", default=";".join(EDITS), help="edits separated by ';'")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    import posprobe

    folder = smollm2_folder()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(args.device).eval()
    docs = documents(folder, args.windows * args.length + 64)
    edits = [e for e in args.edits.split(";") if e]

    def timed(edit: str | None) -> tuple[float, float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        result = posprobe.context(model, [args.length], documents=docs, windows=args.windows, bos_id=None,
                                  edits=[edit] if edit else None)  # fmt: skip
        if args.device != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter() - start, time.process_time() - cpu, float(result.perplexity[0, 0])

    for edit in [None, *edits]:  # warm-up
        timed(edit)
    ratios: dict[str, list[float]] = {e: [] for e in edits}
    cpu_ratios: dict[str, list[float]] = {e: [] for e in edits}
    plain_times: list[float] = []
    plain_cpu: list[float] = []
    perplexity: dict[str, float] = {}
    for _ in range(args.repeats):
        for edit in edits:
            base, base_cpu, perplexity["none"] = timed(None)
            edited, edited_cpu, perplexity[edit] = timed(edit)
            plain_times.append(base)
            plain_cpu.append(base_cpu)
            ratios[edit].append(edited / base)
            cpu_ratios[edit].append(edited_cpu / base_cpu)
    record = {
        "model": "SmolLM2-135M-Instruct (packaged GGUF as float32)",
        "device": args.device,
        "torch_threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "length": args.length,
        "windows": args.windows,
        "repeats": args.repeats,
        "unedited_seconds_median": statistics.median(plain_times),
        "unedited_cpu_seconds_median": statistics.median(plain_cpu),
        "ratio_edited_over_unedited": {
            e: {"median": statistics.median(r), "min": min(r), "max": max(r)} for e, r in ratios.items()
        },
        "cpu_ratio_edited_over_unedited": {
            e: {"median": statistics.median(r), "min": min(r), "max": max(r)} for e, r in cpu_ratios.items()
        },
        "perplexity": perplexity,
    }
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
