"""GLUE benchmark: the packaged MiniLM fine-tuned on CoLA and SST-2 with no / TISA / composite positions.

For every task, seed and mechanism (seed-major order, so a run cut short still has the same seeds for every
mechanism) this fine-tunes with `posprobe.glue.finetune`, then writes a Markdown report (default
`runs/bench_glue/RESULTS_glue.md`; its tables are copied into `benchmarks/RESULTS.md` by hand)
with dev metrics per seed, median, mean ± s.e. and wall time per run. The Markdown is rewritten after
every run, so partial results survive an interruption; re-running the same command resumes (finished
seeds are reused, an interrupted one continues from its last checkpoint).

TISA uses S=5 kernels initialised from `posprobe fit-tisa` on the same model (run first, written next to
the runs); with `--tisa-init zero`, or if fitting fails, zero initialisation is used and the report says so.

Example (what fits on 2 busy CPU cores; the paper setting is the full train set for 3 epochs):

    python benchmarks/bench_glue.py --max-train-samples 2000 --epochs 1 --seeds 3
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from posprobe.errors import PosprobeError  # noqa: E402
from posprobe.glue.tasks import get_task  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "glue")
    p.add_argument("--tasks", default="cola,sst2")
    p.add_argument("--mechanisms", default="none,tisa,composite")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--max-train-samples", type=int, default=None)
    p.add_argument("--max-eval-samples", type=int, default=None)
    p.add_argument("--kernels", type=int, default=5)
    p.add_argument("--radius", type=int, default=8)
    p.add_argument("--tisa-init", choices=("fit", "zero"), default="fit")
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "bench_glue", help="run folders (git-ignored)")
    p.add_argument("--results", type=Path, default=ROOT / "runs" / "bench_glue" / "RESULTS_glue.md")
    return p.parse_args(argv)


def fit_kernels(args: argparse.Namespace, notes: list[str]) -> str:
    """`fit:PATH` from `posprobe fit-tisa` on the packaged model, or `zero` (noted) if that is not possible."""
    if args.tisa_init == "zero":
        notes.append("TISA kernels: zero init (requested with --tisa-init zero).")
        return "zero"
    out = args.runs / "fit-tisa"
    try:
        from posprobe.pipelines.fitting import fit_tisa

        started = time.perf_counter()
        result = fit_tisa(None, [args.kernels], out_dir=out)
        path = result.fits[0].kernels_file
        notes.append(
            f"TISA kernels: fitted with `posprobe fit-tisa --kernels {args.kernels}` on the packaged "
            f"model ({time.perf_counter() - started:.0f} s) -> `{_rel(path)}`."
        )
        return f"fit:{path}"
    except (ImportError, PosprobeError, AttributeError) as err:
        notes.append(f"TISA kernels: zero init, because fitting failed ({type(err).__name__}: {err}).")
        return "zero"


def main(argv: list[str] | None = None) -> None:
    from posprobe.glue.config import FinetuneConfig
    from posprobe.glue.report import aggregate
    from posprobe.glue.run import finetune

    args = parse_args(argv)
    command = "python benchmarks/bench_glue.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    tasks = [get_task(t).name for t in args.tasks.split(",") if t]
    mechanisms = [m for m in args.mechanisms.split(",") if m]
    notes: list[str] = []
    tisa_init = fit_kernels(args, notes) if "tisa" in mechanisms else "zero"
    runs: dict[tuple[str, str], list[dict]] = {(t, m): [] for t in tasks for m in mechanisms}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for task in tasks:
        for seed in range(args.seeds):
            for mech in mechanisms:
                config = FinetuneConfig(
                    task=task,
                    out=args.runs / f"{task}-{mech}",
                    mechanism=mech,
                    kernels=args.kernels,
                    init=tisa_init if mech == "tisa" else "zero",
                    radius=args.radius,
                    seeds=[seed],
                    epochs=args.epochs,
                    lr=args.lr,
                    batch_size=args.batch_size,
                    max_length=args.max_length,
                    max_train_samples=args.max_train_samples,
                    max_eval_samples=args.max_eval_samples,
                    data_dir=args.data_dir,
                    resume=True,
                )
                result = finetune(config, log=lambda msg: print(msg, file=sys.stderr, flush=True))
                runs[(task, mech)].append(
                    {"seed": seed, "metrics": result.metrics[0], "seconds": result.seconds_per_seed[0]}
                )
                write_report(args, command, started, notes, tisa_init, tasks, mechanisms, runs, aggregate)


def write_report(args, command, started, notes, tisa_init, tasks, mechanisms, runs, aggregate) -> None:
    import torch

    from posprobe.formats.writing import write_json, write_text

    lines = [
        "# GLUE benchmark: packaged all-MiniLM-L6-v2, positional mechanisms",
        "",
        f"Command: `{command}`  ",
        f"Started {started}; last update {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.  ",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores "
        f"(shared with other jobs), torch {torch.__version__}, {torch.get_num_threads()} threads, no GPU.",
        "",
        "Settings: "
        + ", ".join(
            [
                (
                    f"train examples {args.max_train_samples} (fixed random subset)"
                    if args.max_train_samples
                    else "train examples all"
                ),
                f"dev examples {args.max_eval_samples or 'all'}",
                f"epochs {args.epochs:g}",
                f"lr {args.lr:g} (linear, 10% warm-up)",
                f"batch {args.batch_size}",
                f"max length {args.max_length}",
                f"TISA S={args.kernels} init `{tisa_init.split(':')[0]}`, position embeddings kept (supplement)",
                f"composite radius {args.radius}, zero init",
            ]
        )
        + ".",
        "",
    ]
    lines += [f"- {n}" for n in notes] + [""]
    lines += [
        "Metrics are fractions (CoLA: Matthews corr.; SST-2: accuracy). s/run = wall time of one "
        "fine-tuning + dev evaluation.",
        "",
        "| task | mechanism | metric | per seed | median | mean ± s.e. | s/run |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = []
    for task in tasks:
        for mech in mechanisms:
            done = runs[(task, mech)]
            if not done:
                continue
            agg = aggregate([r["metrics"] for r in done])
            for name in done[0]["metrics"]:
                per = ", ".join(_f(r["metrics"][name]) for r in done)
                se = agg["stderr"][name]
                secs = sum(r["seconds"] for r in done) / len(done)
                lines.append(
                    f"| {task} | {mech} | {name} | {per} | {_f(agg['median'][name])} | "
                    f"{_f(agg['mean'][name])} ± {_f(se)} | {secs:.0f} |"
                )
            summary.append({"task": task, "mechanism": mech, "runs": done, **agg})
    args.results.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.results, "\n".join(lines) + "\n")
    write_json(args.runs / "bench_glue.json", {"command": command, "notes": notes, "results": summary})


def _rel(path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


if __name__ == "__main__":
    try:
        main()
    except PosprobeError as err:
        print(f"bench_glue: error: {err}", file=sys.stderr)
        sys.exit(2)
