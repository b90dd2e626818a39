"""Cost of retrofitted mechanisms: forward + backward step time and peak memory vs the unmodified model.

    python benchmarks/bench_retrofit.py [--batch 32] [--length 128] [--rounds 3] [--steps 3] [--threads 2]
                                        [--mechanisms tisa,fixed,composite,dynamic,cat] [--out FILE.json]

Each configuration (the unmodified packaged all-MiniLM-L6-v2, then one per mechanism) runs in its own
subprocess, so that its peak resident memory (`ru_maxrss`; torch's CPU allocations are invisible to
tracemalloc) is its own. The configurations are interleaved over `--rounds` rounds, so a change in load
from other processes on a shared machine hits all of them alike; each subprocess does one warm-up step and
`--steps` timed steps (train mode, loss = mean squared last hidden state, backward, gradients cleared).
Reported: the median step time over all rounds and steps, its ratio to the unmodified model's median, and
the process CPU time per step (less sensitive to other processes than wall time), the peak RSS, and the
peak RSS growth during the steps (peak RSS minus RSS after loading the model and building the batch).
"unmodified (eager)" is the stock model on transformers' eager path, for reference: on CPU the explicit
softmax path that score-bias mechanisms use is itself faster than SDPA at n = 128.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

DEFAULT_MECHANISMS = "tisa,fixed,composite,dynamic,cat"


def _rss_kib() -> int:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


def worker(args: argparse.Namespace) -> None:
    """Run one configuration; print one JSON line."""
    import resource
    import time

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from posprobe.retrofitting.install import added_parameters, retrofit
    from posprobe.retrofitting.loading import load_model

    model = load_model(None)
    if args.mechanism == "eager":
        model.set_attn_implementation("eager")
    elif args.mechanism != "none":
        retrofit(model, args.mechanism, init="random", seed=0)
    model.train()
    ids = torch.randint(1000, model.config.vocab_size, (args.batch, args.length))
    mask = torch.ones_like(ids)

    def step() -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        out.pow(2).mean().backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start, time.process_time() - cpu

    rss_before = _rss_kib()
    step()  # warm-up
    measured = [step() for _ in range(args.steps)]
    times, cpu_times = [m[0] for m in measured], [m[1] for m in measured]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(
        json.dumps(
            {
                "mechanism": args.mechanism,
                "times": times,
                "cpu_times": cpu_times,
                "peak_rss_mib": peak / 1024,
                "step_rss_growth_mib": max(0, peak - rss_before) / 1024,
                "added_parameters": added_parameters(model),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mechanisms", default=DEFAULT_MECHANISMS)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", dest="mechanism", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mechanism is not None:
        worker(args)
        return

    configs = ["none", "eager"] + [m for m in args.mechanisms.split(",") if m]
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for rnd in range(args.rounds):
        for config in configs:
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                config,
                "--batch",
                str(args.batch),
                "--length",
                str(args.length),
                "--steps",
                str(args.steps),
                "--threads",
                str(args.threads),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            record = json.loads(done.stdout.strip().splitlines()[-1])
            runs[config].append(record)
            print(
                f"round {rnd + 1}/{args.rounds} {config:12s} " + " ".join(f"{t:.3f}" for t in record["times"]),
                file=sys.stderr,
                flush=True,
            )

    base = statistics.median(t for r in runs["none"] for t in r["times"])
    base_cpu = statistics.median(t for r in runs["none"] for t in r["cpu_times"])
    base_peak = statistics.median(r["peak_rss_mib"] for r in runs["none"])
    base_growth = statistics.median(r["step_rss_growth_mib"] for r in runs["none"])
    rows = []
    for config in configs:
        median = statistics.median(t for r in runs[config] for t in r["times"])
        cpu = statistics.median(t for r in runs[config] for t in r["cpu_times"])
        growth = statistics.median(r["step_rss_growth_mib"] for r in runs[config])
        peak = statistics.median(r["peak_rss_mib"] for r in runs[config])
        label = {"none": "unmodified (sdpa)", "eager": "unmodified (eager)"}.get(config, config)
        rows.append(
            {
                "mechanism": label,
                "added_parameters": runs[config][0]["added_parameters"],
                "median_step_s": round(median, 4),
                "time_ratio": round(median / base, 3),
                "median_cpu_s": round(cpu, 4),
                "cpu_ratio": round(cpu / base_cpu, 3),
                "peak_rss_mib": round(peak, 1),
                "peak_ratio": round(peak / base_peak, 3),
                "step_rss_growth_mib": round(growth, 1),
                "growth_ratio": round(growth / base_growth, 3) if base_growth else None,
            }
        )
    result = {
        "batch": args.batch,
        "length": args.length,
        "rounds": args.rounds,
        "steps": args.steps,
        "threads": args.threads,
        "rows": rows,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
