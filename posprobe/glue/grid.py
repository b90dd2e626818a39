"""A fine-tuning grid: tasks x mechanisms x seeds in one resumable run folder, with paired statistics.

Layout of a grid folder (`out`):

    grid.json                   settings of the grid (tasks, mechanisms, shared settings)
    <task>-<mechanism>/         one `finetune` run folder per cell (seed-<k>/, results.json, ...)
    results.json, results.md    per-seed runs and the SPEC §12 summary (`GridResult.to_dict(settings=True)`)
    results.png                 per-seed points with mean ± s.e. per mechanism and task

Cells run seed-major (seed 0 of every task and mechanism, then seed 1, ...), so a grid cut short still has
the same seeds for every mechanism. Every mechanism gets the same seeds, hence the same classifier-head
initialisation and data order (`data_seed = seed`): differences are paired. `resume=True` continues after a
kill: finished (cell, seed) pairs are read back, not redone; an interrupted one continues from its checkpoint.

Per-cell options: `none` cells are the plain model (no `init`, no `drop_position_embeddings`); `init="fit"`
or `fit:PATH` applies to TISA cells, the other mechanisms start from zero. So cells may differ in settings:
results.json's `settings` holds only what every cell shares, and each entry of `runs` its own cell's `settings`
(`init` included; read from the cell's run.json, which also names the kernels file a fitted init used).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posprobe.errors import ArgumentValueError, PosprobeError
from posprobe.formats.writing import save_figure, write_json, write_text
from posprobe.glue.config import FinetuneConfig
from posprobe.glue.grid_report import GridResult, grid_markdown, grid_summary
from posprobe.glue.tasks import get_task
from posprobe.mechanisms.catalogue import mechanism_info

GRID_FILE = "grid.json"
GRID_KEYS = ("tasks", "mechanisms")  # must match on resume (each cell checks its own settings)


def cell_name(task: str, mechanism: str) -> str:
    return f"{task}-{mechanism}"


def default_grid_folder(model: str | None, tasks: Sequence[str], mechanisms: Sequence[str]) -> Path:
    """`posprobe-out/finetune/<model label>/<task+task>-<mech+mech>`."""
    from posprobe.glue.config import default_model_folder

    return default_model_folder(model) / f"{'+'.join(tasks)}-{'+'.join(mechanisms)}"


def _unique(items: Sequence[str], what: str) -> list[str]:
    items = [str(i).strip() for i in items]
    if not items or any(not i for i in items):
        raise ArgumentValueError(what, f"{{arg}} needs one or more names, got {','.join(items)!r}", "e.g. cola,sst2")
    dup = sorted({i for i in items if items.count(i) > 1})
    if dup:
        raise ArgumentValueError(what, f"{{arg}} lists '{dup[0]}' twice", "list each name once")
    return items


def grid_configs(
    tasks: Sequence[str], mechanisms: Sequence[str], out: Path, seeds: Sequence[int], **settings: Any
) -> dict[tuple[str, str], FinetuneConfig]:
    """One validated `FinetuneConfig` per cell (`resume=True`: cells grow seed by seed), built before any work
    so that a bad setting for any cell is refused at once."""
    init = settings.pop("init", "zero")
    drop = settings.pop("drop_position_embeddings", False)
    settings.pop("resume", None)
    configs = {}
    for task in tasks:
        for mechanism in mechanisms:
            cell_init = init
            # --init fit applies to the mechanisms holding TISA (`tisa`, `tisa+fixed`, ...); the others start at zero
            if mechanism == "none" or (str(init).startswith("fit") and not mechanism_info(mechanism).supports_fit):
                cell_init = "zero"
            config = FinetuneConfig(
                task=task,
                mechanism=mechanism,
                out=out / "_",  # replaced below, once the task name is canonical
                seeds=list(seeds),
                init=cell_init,
                drop_position_embeddings=drop and mechanism != "none",
                resume=True,
                **settings,
            )
            config.out = out / cell_name(config.task, mechanism)
            configs[(config.task, mechanism)] = config
    return configs


def finetune_grid(
    tasks: Sequence[str],
    mechanisms: Sequence[str],
    *,
    out: str | Path | None = None,
    seeds: Sequence[int] = (0,),
    resume: bool = False,
    wait: bool = False,
    progress: bool = False,
    verbose: bool = False,
    callbacks: list | None = None,
    log: Callable[[str], None] | None = None,
    **settings: Any,
) -> GridResult:
    """Fine-tune every (task, mechanism) cell for every seed; returns (and on rank 0 writes) a `GridResult`.

    `settings` are the `FinetuneConfig` fields shared by all cells (model, epochs, lr, batch_size, data_dir,
    ...). The first mechanism is the baseline of the paired differences. `log` receives one line per cell and
    seed with its position in the grid."""
    from posprobe.glue.run import _check_run_folder, _run_folder, finetune
    from posprobe.glue.runtime import is_main_process, own_process_group, quiet

    tasks = _unique(list(tasks), "task")
    mechanisms = _unique(list(mechanisms), "mechanism")
    model = settings.get("model")
    configs = grid_configs(tasks, mechanisms, Path("."), seeds, **settings)  # validates every cell, does nothing
    tasks = list(dict.fromkeys(t for t, _ in configs))  # canonical names (SST-2 -> sst2)
    out = Path(out).expanduser() if out is not None else default_grid_folder(model, tasks, mechanisms)
    for (task, mechanism), config in configs.items():
        config.out = out / cell_name(task, mechanism)
    seeds = list(next(iter(configs.values())).seeds)
    if log is None and verbose:
        log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    say = log or (lambda _msg: None)
    started = time.perf_counter()
    record = {"posprobe_run": "glue-grid", "tasks": tasks, "mechanisms": mechanisms, "seeds": seeds}
    with quiet(not verbose), own_process_group(), _run_folder(out, wait=wait, resume=resume) as folder:
        _check_grid_folder(folder, record, resume)
        for config in configs.values():  # finished cells are skipped below: check their settings here
            if config.out.is_dir():
                _check_run_folder(config, config.out)
        _join_process_group()
        if is_main_process():
            write_json(folder / GRID_FILE, record | {"settings": _shared(configs)})
        total = len(seeds) * len(configs)
        position = 0
        for seed in seeds:
            for (task, mechanism), config in configs.items():
                position += 1
                where = f"[{position}/{total}] {task} × {mechanism}, seed {seed}"
                if (config.out / f"seed-{seed}" / "metrics.json").is_file():
                    say(f"{where}: finished earlier, reused")
                    continue
                say(f"{where}: fine-tuning")
                cell = FinetuneConfig(**{**_init_fields(config), "seeds": [seed]})
                finetune(cell, progress=progress, verbose=verbose, callbacks=callbacks, log=log)
        result = _collect(folder, tasks, mechanisms, seeds, configs, time.perf_counter() - started, model)
        if is_main_process():
            data = result.to_dict(settings=True)
            write_json(folder / "results.json", data)
            write_text(folder / "results.md", grid_markdown(data))
            from posprobe.glue.grid_report import grid_panels
            from posprobe.plotting.grid import grid_figure

            save_figure(grid_figure(grid_panels(data), data["mechanisms"], data["seeds"]), folder / "results.png")
    return result


def _join_process_group() -> None:
    """Under torchrun, create the process group once for the whole grid (each cell's Trainer then uses it and
    the enclosing `own_process_group` destroys it at the end), instead of one group per cell."""
    from posprobe.glue.runtime import world_size

    if world_size() < 2:
        return
    import torch
    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")


def _init_fields(config: FinetuneConfig) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(config, f.name) for f in fields(config) if f.init}


_NOT_SETTINGS = ("task", "mechanism", "out", "seeds", "resume", "posprobe_run", "model_path")


def cell_settings(config: FinetuneConfig) -> dict[str, Any]:
    """The settings one cell ran with: its run.json (written by the cell's own run, so a fitted init's kernels
    file is named) where readable, else its config; without the keys a run entry already states or that name
    folders (task, mechanism, out, seeds, resume, model_path)."""
    from posprobe.glue.run import RUN_FILE

    settings = config.settings()
    try:
        saved = json.loads((config.out / RUN_FILE).read_text())
    except (OSError, ValueError):
        saved = None
    if isinstance(saved, dict):
        settings = {k: saved.get(k, v) for k, v in settings.items()}
    return {k: v for k, v in settings.items() if k not in _NOT_SETTINGS}


def _shared(configs: dict[tuple[str, str], FinetuneConfig]) -> dict[str, Any]:
    """The settings every cell has in common (a setting some cells differ in, such as `init`, is left out: each
    run entry states its cell's own)."""
    cells = [{k: v for k, v in c.settings().items() if k not in _NOT_SETTINGS} for c in configs.values()]
    return {k: v for k, v in cells[0].items() if all(cell.get(k) == v for cell in cells[1:])}


def _check_grid_folder(folder: Path, record: dict[str, Any], resume: bool) -> None:
    """Refuse to overwrite a previous grid unless resuming; when resuming, insist on the same tasks and
    mechanisms (each cell checks its own settings when it runs)."""
    from posprobe.glue.run import cells_hold_seeds

    grid_file = folder / GRID_FILE
    holds = grid_file.is_file() or cells_hold_seeds(folder)
    if holds and not resume:
        raise PosprobeError(
            f"'{folder}' already holds a fine-tuning grid", "pass --resume to continue it, or choose another --out"
        )
    if resume and grid_file.is_file():
        try:
            old = json.loads(grid_file.read_text())
        except ValueError:
            return
        for key in GRID_KEYS:
            if key in old and old[key] != record[key]:
                raise PosprobeError(
                    f"--resume with different {key} than the grid in '{folder}' "
                    f"({','.join(old[key])} there, {','.join(record[key])} now)",
                    "resume with the original lists, or start a new grid with another --out",
                )


def _collect(
    folder: Path,
    tasks: list[str],
    mechanisms: list[str],
    seeds: list[int],
    configs: dict[tuple[str, str], FinetuneConfig],
    seconds: float,
    model: str | None,
) -> GridResult:
    """Read every cell's finished seeds back (seeds of earlier runs included) and summarise them."""
    from posprobe.glue.run import _finished_seeds, _read_finished

    all_seeds = sorted(set(seeds).union(*(_finished_seeds(c.out) for c in configs.values())))
    runs = []
    run_seconds = 0.0
    for seed in all_seeds:
        for (task, mechanism), config in configs.items():
            if (config.out / f"seed-{seed}" / "metrics.json").is_file():
                metrics, elapsed = _read_finished(config.out, seed)
                run_seconds += elapsed
                runs.append({"task": task, "mechanism": mechanism, "seed": seed, "metrics": metrics,
                             "settings": cell_settings(config)})  # fmt: skip
    metric_names = {t: get_task(t).metric_names() for t in tasks}
    summary = grid_summary(runs, tasks, mechanisms, metric_names, all_seeds)
    model_name = _model_name(configs, model)
    return GridResult(
        tasks=tasks,
        mechanisms=mechanisms,
        model=model_name,
        seeds=all_seeds,
        main_metrics={t: metric_names[t][0] for t in tasks},
        runs=runs,
        summary=summary,
        seconds=seconds,
        run_seconds=run_seconds,
        out=folder,
        cells={k: c.out for k, c in configs.items()},
        settings=_shared(configs),
    )


def _model_name(configs: dict[tuple[str, str], FinetuneConfig], model: str | None) -> str:
    """The model name a cell's results.json recorded (else the name given)."""
    for config in configs.values():
        path = config.out / "results.json"
        if path.is_file():
            try:
                return str(json.loads(path.read_text())["model"])
            except (ValueError, KeyError, TypeError):
                pass
    from posprobe.checkpoint.resolve import DEFAULT_MODEL_NAME

    return model or DEFAULT_MODEL_NAME
