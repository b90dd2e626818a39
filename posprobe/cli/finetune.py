"""`posprobe finetune` and `posprobe evaluate`: GLUE fine-tuning with per-seed metrics and aggregates.

Thin layer over `posprobe.glue` (`run.finetune`, `evaluation.evaluate`); no torch or transformers import at
module import time.
Under `torchrun --nproc_per_node=N -m posprobe finetune ...` only rank 0 prints and writes.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json, log_console
from posprobe.cli.options import AllowPickleOpt, JsonOpt, ModelArg
from posprobe.cli.retrofit import DropOpt, KernelsOpt, RadiusOpt
from posprobe.errors import PosprobeError

TaskOpt = Annotated[str, typer.Option("--task", help="GLUE task: cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli.")]
GridTaskOpt = Annotated[
    str,
    typer.Option(
        "--task",
        help="GLUE task(s): cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli; a comma-separated list "
        "(cola,sst2) runs a grid.",
    ),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Local GLUE data: <DIR>/<task>/<split>.jsonl (or .json, .csv, .parquet; HF glue "
        "schema) or the official TSV folders (<DIR>/CoLA/train.tsv, ...); builtin:glue = a small packaged "
        "cola/sst2 sample (not GLUE). Default: the nyu-mll/glue dataset from the hub.",
    ),
]
MaxEvalOpt = Annotated[
    int | None,
    typer.Option("--max-eval-samples", help="Evaluate on at most this many dev examples (fixed random subset)."),
]


def register(app: typer.Typer) -> None:
    """Add the `finetune` and `evaluate` commands to `app`."""
    app.command("finetune")(finetune_command)
    app.command("evaluate")(evaluate_command)


def _mechanism_help() -> str:
    from posprobe.mechanisms.catalogue import MECHANISM_NAMES

    return (
        f"Positional mechanism to retrofit before fine-tuning: none, {', '.join(MECHANISM_NAMES)}; a "
        "comma-separated list (none,tisa,fixed) runs a grid, the first being the baseline of the paired differences."
    )


def finetune_command(
    task: GridTaskOpt,
    model: ModelArg = None,
    model_option: Annotated[
        str | None,
        typer.Option("--model", help="Same as the MODEL argument (kept for older scripts).", show_default=False),
    ] = None,
    mechanism: Annotated[str, typer.Option("--mechanism", help=_mechanism_help())] = "none",
    kernels: KernelsOpt = None,
    init: Annotated[
        str,
        typer.Option(
            "--init",
            help="Init of new positional parameters: zero, random, fit "
            "(TISA: kernels fitted to the model's own profiles), or "
            "fit:PATH (kernels file from `posprobe fit-tisa`).",
        ),
    ] = "zero",
    drop_position_embeddings: DropOpt = False,
    radius: RadiusOpt = None,
    seeds: Annotated[int | None, typer.Option("--seeds", help="Run seeds 0..N-1.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Run this one seed.")] = None,
    epochs: Annotated[float, typer.Option("--epochs", help="Training epochs.")] = 3.0,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (linear warm-up over 10%, then decay).")] = 2e-5,
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Total batch size per step (split over processes under torchrun).")
    ] = 32,
    max_length: Annotated[int, typer.Option("--max-length", help="Truncate inputs to this many tokens.")] = 128,
    max_train_samples: Annotated[
        int | None,
        typer.Option("--max-train-samples", help="Train on at most this many examples (fixed random subset)."),
    ] = None,
    max_eval_samples: MaxEvalOpt = None,
    data_dir: DataDirOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Run folder for checkpoints, models and results "
            "(default: <task>-<mechanism> in the folder <model> of posprobe-out/finetune).",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the run in --out from its last checkpoint, or add seeds to it (same settings); "
            "results cover every finished seed in the folder.",
        ),
    ] = False,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="If another run is using --out, wait for it instead of refusing (with --resume: then add "
            "this run's seeds to it).",
        ),
    ] = False,
    save_steps: Annotated[
        int | None,
        typer.Option("--save-steps", help="Checkpoint every N steps (default: at the end of every epoch)."),
    ] = None,
    json_output: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
) -> None:
    """Fine-tune MODEL on GLUE task(s) for one or more seeds; report dev metrics per seed, median and mean ± s.e.

    Several tasks or mechanisms (comma-separated) run a grid in one resumable folder, with the same seeds and
    data order for every mechanism and paired differences against the first mechanism (SPEC §12)."""
    from posprobe.glue.config import FinetuneConfig, seed_list
    from posprobe.glue.run import finetune
    from posprobe.glue.runtime import is_main_process

    if model is not None and model_option is not None and model != model_option:
        raise PosprobeError(
            f"two models given ('{model}' and --model '{model_option}')", "pass the model once, as MODEL"
        )
    model = model if model is not None else model_option
    settings = dict(
        out=out,
        model=model,
        kernels=kernels,
        init=init,
        drop_position_embeddings=drop_position_embeddings,
        radius=radius,
        seeds=seed_list(seeds, seed),
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        max_length=max_length,
        max_train_samples=max_train_samples,
        max_eval_samples=max_eval_samples,
        data_dir=data_dir,
        resume=resume,
        allow_pickle=allow_pickle,
        save_steps=save_steps,
    )
    tasks, mechanisms = task.split(","), mechanism.split(",")
    if len(tasks) > 1 or len(mechanisms) > 1:
        _grid(tasks, mechanisms, settings, wait=wait, json_output=json_output)
        return
    config = FinetuneConfig(task=task, mechanism=mechanism, **settings)
    main = is_main_process()
    log = (lambda msg: log_console.print(msg, markup=False)) if main else None
    # the Trainer prints its log lines on stdout: keep stdout for the one JSON object
    with contextlib.redirect_stdout(sys.stderr):
        # bars and Trainer log dicts only on a terminal: piped or CI output stays clean
        result = finetune(config, log=log, progress=main and sys.stderr.isatty(), wait=wait)
    if not main:
        return
    console.print(results_table(result.to_dict()))
    console.print(f"results: {result.out}/results.json, {result.out}/results.md", markup=False)
    if json_output:
        emit_json(result.to_dict())


def _grid(tasks: list[str], mechanisms: list[str], settings: dict, *, wait: bool, json_output: bool) -> None:
    """`finetune` with several tasks or mechanisms: `posprobe.glue.grid.finetune_grid`, its tables and JSON."""
    from posprobe.glue.grid import finetune_grid
    from posprobe.glue.runtime import is_main_process

    main = is_main_process()
    log = (lambda msg: log_console.print(msg, markup=False)) if main else None
    with contextlib.redirect_stdout(sys.stderr):
        result = finetune_grid(tasks, mechanisms, log=log, progress=main and sys.stderr.isatty(), wait=wait, **settings)
    if not main:
        return
    from posprobe.glue.grid_report import summary_tables

    data = result.to_dict()
    for title, header, rows in summary_tables(data)[:2] + [_all_metrics_table(data)]:
        console.print(_grid_table(title, header, rows))
    console.print(f"results: {result.out}/results.json, results.md, results.png", markup=False)
    if json_output:
        emit_json(data)


def _grid_table(title: str, header: list[str], rows: list[list[str]]):
    """A grid summary as a compact rich table (no side borders, one space between columns)."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 0), show_edge=False)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def _all_metrics_table(data: dict) -> tuple[str, list[str], list[list[str]]]:
    """The grid's every-metric table for a terminal: the paired difference as 'Δ ± s.e.' and 'p' columns (one line
    per row at 80 columns; the whole cell, 95% interval included, took 4 lines), the interval being in the table of
    main metrics above and in results.md."""
    from posprobe.glue.report import fmt

    base = data["mechanisms"][0]
    rows = []
    for r in data["summary"]:
        d = r["delta"]
        mean = fmt(r["mean"]) if r["stderr"] is None else f"{fmt(r['mean'])} ± {fmt(r['stderr'])}"
        if r["mechanism"] == base:
            change, p = "baseline", ""
        elif d is None:
            change, p = "—", "—"
        else:
            change = f"{d['mean']:+.4f}" + ("" if d.get("stderr") is None else f" ± {d['stderr']:.4f}")
            p = f"{'' if d.get('p_exact', True) else '≈'}{d['p_value']:.2g}"
        rows.append([r["task"], r["metric"], r["mechanism"], fmt(r["median"]), mean, str(r["n"]), change, p])
    header = ["task", "metric", "mechanism", "median", "mean ± s.e.", "n", f"Δ vs {base}", "p"]
    return "all metrics (95% intervals: the table above, results.md)", header, rows


def evaluate_command(
    model_dir: Annotated[
        Path,
        typer.Argument(
            help="A fine-tuned model folder, or a `finetune --out` folder (all its seed-*/model are evaluated)."
        ),
    ],
    task: TaskOpt,
    data_dir: DataDirOpt = None,
    max_eval_samples: MaxEvalOpt = None,
    allow_new_head: Annotated[
        bool,
        typer.Option(
            "--allow-new-head",
            help="Score a checkpoint that has no trained classification head (with a randomly initialised one).",
        ),
    ] = False,
    json_output: JsonOpt = False,
) -> None:
    """Re-evaluate saved fine-tuned model(s) on the dev split(s) of a GLUE task."""
    from posprobe.glue.evaluation import evaluate
    from posprobe.glue.runtime import is_main_process

    main = is_main_process()
    log = (lambda msg: log_console.print(msg, markup=False)) if main else None
    with contextlib.redirect_stdout(sys.stderr):
        result = evaluate(
            model_dir, task, data_dir, max_eval_samples=max_eval_samples, allow_new_head=allow_new_head, log=log
        )
    if not main:
        return
    console.print(results_table(result))
    if json_output:
        emit_json(result)


def results_table(result: dict):
    """The per-seed metrics and their aggregates as a rich Table (for stderr)."""
    from rich.table import Table

    from posprobe.glue.report import table_rows

    names, rows = table_rows(result)
    table = Table(title=f"GLUE {result['task']} — {result['mechanism']}")
    table.add_column("seed")
    for name in names:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*row, style="bold" if row[0] == "median" else None)
    return table
