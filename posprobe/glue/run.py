"""Fine-tuning runs: `finetune()` trains one model per seed with the Hugging Face Trainer and returns a
`FinetuneResult`.

Layout of a run folder (`out`):

    run.json                    settings of the run (checked again on resume)
    seed-<k>/checkpoint-<step>  Trainer checkpoints (model, optimizer, scheduler, RNG states) while training
    seed-<k>/model/             the fine-tuned model + tokenizer + posprobe_glue.json once seed k finished
    seed-<k>/metrics.json       dev metrics of seed k (its presence marks the seed as done)
    results.json, results.md    per-seed metrics and aggregates (median, mean, standard error)

One run at a time per folder: the folder is locked while a run uses it (a second run refuses at once, or waits
with `wait=True`). Every file appears under its final name only when complete (results by atomic rename, the
model folder by renaming a finished temporary folder), so a failure, a full disk or Ctrl-C leaves no half-written
result; a folder the run created and left without anything to resume is removed again.

`resume=True` skips finished seeds and continues an interrupted one from its last checkpoint; the Trainer
restores optimizer, scheduler, data position and RNG states, so the result equals an uninterrupted run.
Multi-process: the same call works under `torchrun --nproc_per_node=N` (gloo on CPU, NCCL on GPU); each of N
processes gets `batch_size / N` examples per step; only rank 0 writes files.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from posprobe.checkpoint.loading import load_tokenizer
from posprobe.errors import PosprobeError
from posprobe.formats.writing import disk_full, disk_full_error, write_json, write_text
from posprobe.glue.config import RESUME_KEYS, FinetuneConfig, check_mechanism_options
from posprobe.glue.data import load_glue
from posprobe.glue.report import FinetuneResult, aggregate, fmt, results_markdown
from posprobe.glue.runtime import (
    EncodedSplit,
    close_progress_bars,
    encode,
    is_main_process,
    label_kwargs,
    make_trainer,
    own_process_group,
    predict_metrics,
    quiet,
    training_arguments,
    world_size,
)
from posprobe.glue.tasks import GlueTask, get_task

META_FILE = "posprobe_glue.json"
RUN_FILE = "run.json"


def finetune(
    config: FinetuneConfig | None = None,
    *,
    progress: bool = False,
    verbose: bool = False,
    wait: bool = False,
    callbacks: list | None = None,
    log: Callable[[str], None] | None = None,
    **settings: Any,
) -> FinetuneResult:
    """Fine-tune a model on a GLUE task for every seed; returns (and on rank 0 writes) the results.

    Pass a `FinetuneConfig`, or its fields as keywords: `finetune(task="sst2", out="runs/sst2", model=...)`.
    Quiet by default: `progress=True` shows the Trainer's progress bars and log lines, `verbose=True` prints
    what the run does (on stderr) and lets transformers report. `wait=True` waits for another run using the
    same folder instead of refusing. `callbacks` are extra `TrainerCallback`s; `log` receives the messages.
    """
    if config is None:
        config = FinetuneConfig(**settings)
    elif settings:
        raise TypeError("pass either a FinetuneConfig or its fields as keywords, not both")
    elif not isinstance(config, FinetuneConfig):
        raise TypeError(f"config must be a FinetuneConfig, got {type(config).__name__}")
    if log is None and verbose:
        log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    say = log or (lambda _msg: None)
    with quiet(not verbose), own_process_group(), _run_folder(config.out, wait=wait, resume=config.resume) as out:
        return _finetune(config, out, progress=progress, callbacks=callbacks, say=say)


@contextlib.contextmanager
def _run_folder(out: Path, *, wait: bool, resume: bool = False) -> Iterator[Path]:
    """Create (if needed) and lock the run folder; map a full disk to one clean error; on failure remove the
    folder again if this call created it and nothing in it can be resumed. With `wait` and without `resume`,
    a folder that holds a run is refused before waiting (after the wait it would be refused anyway)."""
    path = Path(out).expanduser()
    created = [p for p in (path, *path.parents) if not p.exists()]  # innermost first
    main = is_main_process()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PosprobeError(
            f"cannot create output folder '{path}' ({err.strerror or err})", "choose a writable folder with --out"
        ) from err
    lock = None
    try:
        if not os.access(path, os.W_OK):
            raise PosprobeError(f"cannot write to output folder '{path}'", "choose a writable folder with --out")
        if main:  # other ranks of a torchrun job share rank 0's lock
            # plain --wait into a folder holding a run: after the wait the run would be refused, so refuse now
            joins_run = wait and not resume and _holds_run(path)
            lock = _lock(path, wait and not joins_run, busy_holds_run=joins_run)
        yield path
    except BaseException as err:
        if main:
            _drop_incomplete_checkpoints(path)
            if created and _remove_if_nothing_to_resume(path):
                for parent in created[1:]:  # the parents this run created, if nothing else is in them
                    with contextlib.suppress(OSError):
                        parent.rmdir()
        if disk_full(err):
            raise disk_full_error(err, path) from err
        raise
    finally:
        if lock is not None:
            os.close(lock)  # closing the descriptor releases the lock


def _lock(path: Path, wait: bool, busy_holds_run: bool = False) -> int | None:
    """An exclusive `flock` on the folder itself (no lock file is left behind); None where unsupported.
    `busy_holds_run`: a busy folder is refused as holding a run (only `--resume --wait` may queue into it)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        if busy_holds_run:
            raise PosprobeError(
                f"'{path}' already holds a fine-tuning run (in progress)",
                "pass --resume --wait to queue behind it and add your seeds, or choose another --out",
            ) from None
        raise PosprobeError(
            f"'{path}' is in use by another fine-tuning run",
            "wait for it to finish (or pass --wait to queue behind it), or choose another --out",
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _holds_run(path: Path) -> bool:
    """Whether `path` holds (or is running) a fine-tuning run: its settings file or a seed to resume."""
    if (path / RUN_FILE).is_file() or (path / "grid.json").is_file() or _previous_seeds(path):
        return True
    return cells_hold_seeds(path)


def cells_hold_seeds(path: Path) -> bool:
    """Whether a sub-folder of `path` (the cells of a grid) holds a finished or resumable seed."""
    return path.is_dir() and any(_previous_seeds(cell) for cell in path.iterdir() if cell.is_dir())


def _previous_seeds(out: Path) -> list[Path]:
    """The seed folders of earlier runs in `out`: finished (metrics.json) or resumable (a checkpoint)."""
    return [
        p for p in out.glob("seed-*") if p.is_dir() and (any(p.glob("checkpoint-*")) or (p / "metrics.json").exists())
    ]


def _drop_incomplete_checkpoints(path: Path) -> None:
    """Remove checkpoints cut off while being written (the Trainer writes `trainer_state.json` last), so that a
    resume never starts from a damaged one."""
    for ckpt in path.glob("seed-*/checkpoint-*"):
        if ckpt.is_dir() and not (ckpt / "trainer_state.json").is_file():
            shutil.rmtree(ckpt, ignore_errors=True)


def _remove_if_nothing_to_resume(path: Path) -> bool:
    """Delete a run folder this call created, unless it (or a grid cell in it) holds a checkpoint or a finished
    seed; True if gone."""
    if _previous_seeds(path) or cells_hold_seeds(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()


def _finetune(
    config: FinetuneConfig,
    out: Path,
    *,
    progress: bool,
    callbacks: list | None,
    say: Callable[[str], None],
) -> FinetuneResult:
    from posprobe.checkpoint.resolve import resolve_model
    from posprobe.checkpoint.weights import check_finite_weights

    started = time.perf_counter()
    task = get_task(config.task)
    check_mechanism_options(
        config.mechanism, config.radius, config.kernels, config.init, config.drop_position_embeddings
    )  # again: a kernels file may have changed since the config was built
    _check_run_folder(config, out)
    if is_main_process():  # at once: a `--wait` run arriving now sees that this folder holds a run
        write_json(out / RUN_FILE, {"posprobe_run": "glue-finetune", **config.settings()})
    # cheap checks first, the model's before the data's: one bad input is one line, before anything is printed
    source = resolve_model(config.model, allow_pickle=config.allow_pickle, with_tokenizer=True)
    retrofitted = (source.config.get("posprobe") or {}).get("mechanism")
    if retrofitted and config.mechanism != "none":
        raise PosprobeError(
            f"'{source.name}' is already retrofitted with '{retrofitted}'",
            "fine-tune it with --mechanism none (its mechanism is kept), or start from a plain model",
        )
    check_finite_weights(source)
    config.source_mechanism = retrofitted or None
    splits = load_glue(
        task, config.data_dir, max_train_samples=config.max_train_samples, max_eval_samples=config.max_eval_samples
    )
    for data in splits.values():
        say(data.describe())
    tokenizer = load_tokenizer(source.path)
    train_set = encode(tokenizer, splits["train"], config.max_length)
    dev_sets = {s: encode(tokenizer, splits[s], config.max_length) for s in task.dev_splits}
    if config.init == "fit":  # only a mechanism that supports it gets here (`check_settings`)
        from posprobe.pipelines.fitting import fit_kernels_file

        say(f"fitting S={config.kernels} TISA kernels to the head profiles of {source.name}")
        config.fitted_kernels = str(
            fit_kernels_file(str(source.path), config.kernels, out / "fit-tisa", config.allow_pickle)
        )
    if is_main_process():
        write_json(
            out / RUN_FILE, {"posprobe_run": "glue-finetune", **config.settings(), "model_path": str(source.path)}
        )

    done: dict[int, tuple[dict[str, float | None], float]] = {}
    for seed in config.seeds:
        done[seed] = _run_seed(
            config, task, source, tokenizer, train_set, dev_sets, seed, out, callbacks, say, progress
        )
        say(f"seed {seed}: " + ", ".join(f"{k}={fmt(v)}" for k, v in done[seed][0].items()))
    # the results of a run folder cover every finished seed in it (earlier `--resume` runs with other seeds
    # were checked to have the same settings), never only the seeds of this call
    for seed in _finished_seeds(out):
        if seed not in done:
            done[seed] = _read_finished(out, seed)
    seeds = sorted(done)
    agg = aggregate([done[s][0] for s in seeds])
    result = FinetuneResult(
        task=task.name,
        mechanism=config.installed_mechanism,
        model=source.name,
        seeds=seeds,
        metrics=[done[s][0] for s in seeds],
        median=agg["median"],
        mean=agg["mean"],
        stderr=agg["stderr"],
        n=agg["n"],
        seconds=time.perf_counter() - started,
        seconds_per_seed=[done[s][1] for s in seeds],
        world_size=world_size(),
        out=out,
        model_dirs={seed: out / f"seed-{seed}" / "model" for seed in seeds},
        settings={**config.settings(), "seeds": seeds},
    )
    if is_main_process():
        record = result.to_dict(settings=True)
        write_json(out / "results.json", record)
        write_text(out / "results.md", results_markdown(record))
    return result


def _check_run_folder(config: FinetuneConfig, out: Path) -> None:
    """Refuse to overwrite a previous run unless resuming; when resuming, insist on the same settings."""
    previous = _previous_seeds(out)
    if previous and not config.resume:
        raise PosprobeError(
            f"'{out}' already holds a fine-tuning run ({previous[0].name})",
            "pass --resume to continue it, or choose another --out",
        )
    run_file = out / RUN_FILE
    if config.resume and run_file.is_file():
        try:
            old = json.loads(run_file.read_text())
        except ValueError:
            return
        new = config.settings()
        changed = [k for k in RESUME_KEYS if k in old and old[k] != new[k]]
        if changed:
            k = changed[0]
            raise PosprobeError(
                f"--resume with different settings than the run in '{out}' ({k}: {old[k]!r} there, {new[k]!r} now)",
                "resume with the original options, or start a new run with another --out",
            )


def _finished_seeds(out: Path) -> list[int]:
    """The seeds with a `seed-<k>/metrics.json` in the run folder, ascending."""
    found = []
    for path in out.glob("seed-*/metrics.json"):
        suffix = path.parent.name.removeprefix("seed-")
        if suffix.isdigit():
            found.append(int(suffix))
    return sorted(found)


def _read_finished(out: Path, seed: int) -> tuple[dict[str, float | None], float]:
    """(metrics, seconds) of a finished seed, from its `metrics.json`."""
    done_file = out / f"seed-{seed}" / "metrics.json"
    try:
        saved = json.loads(done_file.read_text())
        return dict(saved["metrics"]), float(saved.get("seconds", 0.0))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise PosprobeError(
            f"'{done_file}' is damaged ({err})",
            f"delete {done_file.parent} and run again with --resume to retrain seed {seed}",
        ) from err


def build_model(config: FinetuneConfig, task: GlueTask, model_path: Path, seed: int):
    """The model to fine-tune, always loaded through `posprobe.load_model`: a plain classifier
    (`none`), one retrofitted now with `config.mechanism`, or a checkpoint retrofitted earlier, whose
    mechanism comes back with it. The task head is new (initialised from `seed`): training is what fits it."""
    from transformers import AutoModelForSequenceClassification

    from posprobe.retrofitting.install import retrofit
    from posprobe.retrofitting.loading import load_model

    model = load_model(
        str(model_path),
        model_class=AutoModelForSequenceClassification,
        allow_pickle=config.allow_pickle,
        ignore_mismatched_sizes=True,
        **label_kwargs(task),
    )
    if config.mechanism == "none":  # plain, or already retrofitted: its mechanism came back with it
        return model
    init = f"fit:{config.fitted_kernels}" if config.init == "fit" else config.init
    return retrofit(
        model,
        config.mechanism,
        radius=config.radius,
        kernels=config.kernels,
        init=init,
        drop_position_embeddings=config.drop_position_embeddings,
        seed=seed,
    )


def _run_seed(
    config: FinetuneConfig,
    task: GlueTask,
    source,
    tokenizer,
    train_set: EncodedSplit,
    dev_sets: dict[str, EncodedSplit],
    seed: int,
    out: Path,
    callbacks: list | None,
    say: Callable[[str], None],
    progress: bool,
) -> tuple[dict[str, float | None], float]:
    """Train and evaluate one seed (or reuse its finished result when resuming): (metrics, seconds)."""
    from transformers import set_seed
    from transformers.trainer_utils import get_last_checkpoint

    seed_dir = out / f"seed-{seed}"
    done_file = seed_dir / "metrics.json"
    if config.resume and done_file.is_file():
        say(f"seed {seed}: already finished, reusing {done_file}")
        return _read_finished(out, seed)
    last = get_last_checkpoint(str(seed_dir)) if config.resume and seed_dir.is_dir() else None
    if config.resume:
        say(f"seed {seed}: resuming from {last}" if last else f"seed {seed}: no checkpoint yet, starting fresh")

    started = time.perf_counter()
    set_seed(seed)  # the classifier head (and retrofitted parameters) are initialised from this seed
    model = build_model(config, task, source.path, seed)
    save = {"save_strategy": "epoch"} if config.save_steps is None else {"save_strategy": "steps"}
    args = training_arguments(
        seed_dir,
        seed=seed,
        batch_size=config.batch_size,
        eval_batch_size=config.eval_batch_size,
        progress=progress,
        train={
            "num_train_epochs": config.epochs,
            "max_steps": config.max_steps,
            "learning_rate": config.lr,
            "weight_decay": config.weight_decay,
            "warmup_steps": config.warmup,  # a float below 1 is a fraction of the optimiser steps
            "lr_scheduler_type": "linear",
            "logging_strategy": "steps",
            "logging_steps": 50,
            "save_total_limit": 2,
            **save,
            **({"save_steps": config.save_steps} if config.save_steps else {}),
        },
    )
    trainer = make_trainer(model, args, tokenizer, progress=progress, train_dataset=train_set, callbacks=callbacks)
    try:
        trainer.train(resume_from_checkpoint=last)
        metrics = predict_metrics(trainer, task, dev_sets)
    finally:
        close_progress_bars(trainer)
    elapsed = time.perf_counter() - started

    model_dir = seed_dir / "model"
    if is_main_process():
        meta = {
            "task": task.name,
            "mechanism": config.installed_mechanism,
            "seed": seed,
            "base_model": source.name,
            "max_length": config.max_length,
            "metrics": metrics,
        }
        _save_model(trainer, model_dir, meta)
        write_json(done_file, {"seed": seed, "metrics": metrics, "seconds": elapsed})
        if not config.keep_checkpoints:
            for ckpt in seed_dir.glob("checkpoint-*"):
                shutil.rmtree(ckpt, ignore_errors=True)
    return metrics, elapsed


def _save_model(trainer, model_dir: Path, meta: dict[str, Any]) -> None:
    """Write the fine-tuned model, its tokenizer and `posprobe_glue.json` into a temporary sibling folder and
    rename it to `model_dir` once complete. A retrofitted model goes through `save_retrofitted`."""
    from posprobe.retrofitting.install import is_retrofitted, save_retrofitted

    partial = model_dir.with_name(f".{model_dir.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        if is_retrofitted(trainer.model):
            save_retrofitted(trainer.model, str(partial))
        else:
            trainer.model.save_pretrained(str(partial))
        trainer.processing_class.save_pretrained(str(partial))
        write_json(partial / META_FILE, meta)
        shutil.rmtree(model_dir, ignore_errors=True)
        os.replace(partial, model_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
