"""Benchmark: default TISA fit vs the exhaustive fit (many restarts, long runs) of the same fitter.

Cases: (a) the packaged all-MiniLM-L6-v2 (6 x 12 = 72 heads), (b) a BERT-base-sized random checkpoint
(BertConfig() defaults, 12 x 12 = 144 heads, random weights, saved with save_pretrained to a temp dir).
Reports fitting seconds (profiles are computed once, outside the timing) and the median per-head R^2
of both fits, for S = 1, 3, 5 (override with --kernels), paper mode.

Requirement checked: default fit <= 5 s and |median R^2 (default) - median R^2 (exhaustive)| <= 0.01.

    python benchmarks/bench_fit_tisa.py [--kernels 1,3,5] [--skip-bert]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def bench_case(name: str, model: str | None, kernels: list[int]) -> list[dict]:
    from posprobe.analysis.tisa_fit import TisaKernelFitter
    from posprobe.pipelines.weights import profiles as compute_profiles

    start = time.perf_counter()
    prof = compute_profiles(model, None, "paper")
    profile_s = time.perf_counter() - start
    flat = prof.profiles.reshape(-1, prof.profiles.shape[-1])
    rows = []
    for s in kernels:
        t0, c0 = time.perf_counter(), time.process_time()
        fast = TisaKernelFitter(s, seed=0).fit(flat, prof.offsets)
        t1, c1 = time.perf_counter(), time.process_time()
        slow = TisaKernelFitter(s, seed=0, exhaustive=True).fit(flat, prof.offsets)
        t2 = time.perf_counter()
        row = {
            "case": name,
            "heads": flat.shape[0],
            "S": s,
            "window": fast.window_,
            "profile_s": profile_s,
            "default_s": t1 - t0,
            "default_cpu_s": c1 - c0,
            "exhaustive_s": t2 - t1,
            "default_median_r2": float(np.median(fast.r2_)),
            "exhaustive_median_r2": float(np.median(slow.r2_)),
            "worst_head_gap": float(np.max(slow.r2_ - fast.r2_)),
        }
        row["median_gap"] = row["exhaustive_median_r2"] - row["default_median_r2"]
        rows.append(row)
        print(
            f"{name:28s} heads={row['heads']:3d} S={s} default {row['default_s']:5.2f} s "
            f"(cpu {row['default_cpu_s']:.2f}) median R2 {row['default_median_r2']:.4f} | "
            f"exhaustive {row['exhaustive_s']:6.2f} s "
            f"median R2 {row['exhaustive_median_r2']:.4f} | gap {row['median_gap']:+.4f} "
            f"(worst head {row['worst_head_gap']:+.4f})",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="1,3,5")
    parser.add_argument("--skip-bert", action="store_true")
    args = parser.parse_args()
    kernels = [int(x) for x in args.kernels.split(",")]
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, numpy {np.__version__}, "
        f"load average at start {os.getloadavg()[0]:.1f}"
    )
    rows = bench_case("all-MiniLM-L6-v2 (packaged)", None, kernels)
    if not args.skip_bert:
        import torch
        import transformers as tf

        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as tmp:
            tf.BertModel(tf.BertConfig()).save_pretrained(tmp)
            rows += bench_case("BERT-base random (12x12)", tmp, kernels)
    ok = all(r["default_s"] <= 5.0 and abs(r["median_gap"]) <= 0.01 for r in rows)
    print(
        "\n| case | heads | S | window | default s (wall) | default s (CPU) | default median R² | exhaustive s | "
        "exhaustive median R² | gap | worst head gap |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['case']} | {r['heads']} | {r['S']} | {r['window']} | {r['default_s']:.2f} | "
            f"{r['default_cpu_s']:.2f} | "
            f"{r['default_median_r2']:.4f} | {r['exhaustive_s']:.1f} | {r['exhaustive_median_r2']:.4f} | "
            f"{r['median_gap']:+.4f} | {r['worst_head_gap']:+.4f} |"
        )
    print(f"\nrequirement (default <= 5 s, |median gap| <= 0.01): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
