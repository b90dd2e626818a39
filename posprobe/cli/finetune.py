"""`posprobe finetune` and `posprobe evaluate`: GLUE fine-tuning with per-seed metrics and aggregates.

Thin layer over `posprobe.glue.train`; no torch or transformers import at module import time.
Under `torchrun --nproc_per_node=N -m posprobe finetune ...` only rank 0 prints and writes.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json
from posprobe.cli.options import AllowPickleOpt, JsonOpt
from posprobe.errors import PosprobeError

TaskOpt = Annotated[str, typer.Option("--task", help="GLUE task: cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli.")]
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Local GLUE data: <DIR>/<task>/<split>.jsonl|json|csv|parquet (HF glue "
        "schema) or the official TSV folders (<DIR>/CoLA/train.tsv, ...). "
        "Default: the nyu-mll/glue dataset from the hub.",
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
    return "Positional mechanism to retrofit before fine-tuning: none, or a registered one (tisa, composite, ...)."


def finetune_command(
    task: TaskOpt,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Hub model id or local folder; default: the packaged all-MiniLM-L6-v2."),
    ] = None,
    mechanism: Annotated[str, typer.Option("--mechanism", help=_mechanism_help())] = "none",
    kernels: Annotated[int, typer.Option("--kernels", help="TISA kernels per head (S).")] = 5,
    init: Annotated[
        str,
        typer.Option(
            "--init",
            help="Init of new positional parameters: zero, random, fit "
            "(TISA: kernels fitted to the model's own profiles), or "
            "fit:PATH (kernels file from `posprobe fit-tisa`).",
        ),
    ] = "zero",
    drop_position_embeddings: Annotated[
        bool,
        typer.Option(
            "--drop-position-embeddings", help="Replace absolute position embeddings by their mean (TISA 'replace')."
        ),
    ] = False,
    radius: Annotated[int, typer.Option("--radius", help="Clip radius r of relative mechanisms.")] = 8,
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
            "--out", help="Run folder for checkpoints, models and results (default: runs/glue/<task>-<mechanism>)."
        ),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in --out from its last checkpoint.")
    ] = False,
    save_steps: Annotated[
        int | None,
        typer.Option("--save-steps", help="Checkpoint every N steps (default: at the end of every epoch)."),
    ] = None,
    json_output: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
) -> None:
    """Fine-tune on a GLUE task for one or more seeds; report dev metrics per seed, median and mean ± s.e."""
    from posprobe.glue.tasks import get_task
    from posprobe.glue.train import FinetuneConfig, finetune, is_main_process, results_table, seed_list

    task_obj = get_task(task)
    if kernels < 1:
        raise PosprobeError(f"--kernels {kernels} must be at least 1", "pass e.g. --kernels 5")
    if radius < 1:
        raise PosprobeError(f"--radius {radius} must be at least 1", "pass e.g. --radius 8")
    config = FinetuneConfig(
        task=task_obj.name,
        out=out or Path("runs") / "glue" / f"{task_obj.name}-{mechanism}",
        model=model,
        mechanism=mechanism,
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
    main = is_main_process()
    log = (lambda msg: console.print(msg, markup=False)) if main else None
    # the Trainer prints its log lines on stdout: keep stdout for the one JSON object
    with contextlib.redirect_stdout(sys.stderr):
        result = finetune(config, log=log)
    if not main:
        return
    console.print(results_table(result))
    console.print(f"results: {config.out}/results.json, {config.out}/results.md", markup=False)
    if json_output:
        emit_json({k: v for k, v in result.items() if k != "settings"})


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
    json_output: JsonOpt = False,
) -> None:
    """Re-evaluate saved fine-tuned model(s) on the dev split(s) of a GLUE task."""
    from posprobe.glue.train import evaluate, is_main_process, results_table

    main = is_main_process()
    log = (lambda msg: console.print(msg, markup=False)) if main else None
    with contextlib.redirect_stdout(sys.stderr):
        result = evaluate(model_dir, task, data_dir, max_eval_samples=max_eval_samples, log=log)
    if not main:
        return
    console.print(results_table(result))
    if json_output:
        emit_json(result)
