"""Re-evaluating saved fine-tuned models on GLUE dev splits: `evaluate()`.

Every model is loaded through `posprobe.load_model`, so a retrofitted mechanism is part of what is
scored, and a checkpoint without trained head weights is refused (unless `allow_new_head=True`).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posprobe.checkpoint.loading import load_tokenizer
from posprobe.errors import PosprobeError
from posprobe.glue.data import GlueSplit, load_glue
from posprobe.glue.report import aggregate, fmt
from posprobe.glue.run import META_FILE
from posprobe.glue.runtime import (
    encode,
    load_classifier,
    make_trainer,
    own_process_group,
    predict_metrics,
    quiet,
    training_arguments,
)
from posprobe.glue.tasks import GlueTask, get_task
from posprobe.validation import as_bool, as_int, as_path


def evaluate(
    model_dir: str | Path,
    task: str | GlueTask,
    data_dir: str | Path | None = None,
    *,
    max_eval_samples: int | None = None,
    batch_size: int = 64,
    max_length: int | None = None,
    allow_new_head: bool = False,
    verbose: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Re-evaluate fine-tuned model(s) on the dev split(s) of `task`.

    `model_dir` is either one saved model (a folder with config.json, e.g. `<run>/seed-0/model`) or a whole
    run folder (`out` of finetune), whose `seed-*/model` folders are all evaluated and aggregated. Returns
    {task, mechanism, model, seeds, metrics (one dict per model), median, mean, stderr, n, seconds, models}.
    `allow_new_head=True` scores a checkpoint whose classification head is missing (a random head).
    """
    root = as_path(model_dir, "model_dir")
    task = get_task(task)
    if max_eval_samples is not None:
        max_eval_samples = as_int(max_eval_samples, "max_eval_samples", minimum=1)
    batch_size = as_int(batch_size, "batch_size", minimum=1)
    if max_length is not None:
        max_length = as_int(max_length, "max_length", minimum=2)
    allow_new_head = as_bool(allow_new_head, "allow_new_head")
    if log is None and verbose:
        log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    say = log or (lambda _msg: None)
    started = time.perf_counter()
    if (root / "config.json").is_file():
        folders = [root]
    else:
        folders = sorted(
            (p for p in root.glob("seed-*/model") if (p / "config.json").is_file()), key=lambda p: _seed_of(p.parent)
        )
    if not folders and not root.exists():
        raise PosprobeError(
            f"'{root}' does not exist", "pass a folder written by `posprobe finetune --out DIR` (or its seed-*/model)"
        )
    if not folders:
        raise PosprobeError(
            f"'{root}' holds no fine-tuned model (no config.json, no seed-*/model)",
            "pass a folder written by `posprobe finetune --out DIR` (or its seed-*/model)",
        )
    per_model: list[dict[str, float | None]] = []
    seeds: list[int | None] = []
    mechanisms: set[str] = set()
    with quiet(not verbose), own_process_group():
        first = _load_checked(folders[0], task, allow_new_head)  # the model's checks before the data is read
        splits = load_glue(task, data_dir, splits=list(task.dev_splits), max_eval_samples=max_eval_samples)
        for data in splits.values():
            say(data.describe())
        for folder in folders:
            meta = _read_meta(folder)
            if meta.get("task") not in (None, task.name):
                say(f"note: {folder} was fine-tuned on {meta['task']}, evaluating on {task.name}")
            model = first if folder == folders[0] else _load_checked(folder, task, allow_new_head)
            metrics, mechanism = _evaluate_folder(folder, model, task, splits, meta, batch_size, max_length)
            mechanisms.add(mechanism)
            say(f"{folder}: " + ", ".join(f"{k}={fmt(v)}" for k, v in metrics.items()))
            per_model.append(metrics)
            seeds.append(meta.get("seed"))
    return {
        "task": task.name,
        "mechanism": ",".join(sorted(mechanisms)),
        "model": str(root),
        "seeds": seeds,
        "metrics": per_model,
        **aggregate(per_model),
        "seconds": time.perf_counter() - started,
        "models": [str(f) for f in folders],
    }


def _seed_of(path: Path) -> int:
    try:
        return int(path.name.split("-", 1)[1])
    except (IndexError, ValueError):
        return 1 << 30


def _read_meta(folder: Path) -> dict[str, Any]:
    file = folder / META_FILE
    if not file.is_file():
        return {}
    try:
        meta = json.loads(file.read_text())
        return meta if isinstance(meta, dict) else {}
    except ValueError:
        return {}


def _load_checked(folder: Path, task: GlueTask, allow_new_head: bool):
    """The saved classifier in `folder`, refused unless it has a trained head with the task's outputs."""
    from posprobe.glue.runtime import label_kwargs

    extra = {**label_kwargs(task), "ignore_mismatched_sizes": True} if allow_new_head else {}
    model = load_classifier(folder, allow_new_head=allow_new_head, **extra)
    if model.config.num_labels != task.num_labels:
        raise PosprobeError(
            f"'{folder}' has {model.config.num_labels} output(s) but {task.name} needs {task.num_labels}",
            "evaluate on the task the model was fine-tuned on",
        )
    return model


def _evaluate_folder(
    folder: Path,
    model,
    task: GlueTask,
    splits: dict[str, GlueSplit],
    meta: dict[str, Any],
    batch_size: int,
    max_length: int | None,
) -> tuple[dict[str, float | None], str]:
    """(metrics, mechanism) of one saved model (`model`, loaded from `folder`)."""
    mechanism = str((getattr(model.config, "posprobe", None) or {}).get("mechanism", "none"))
    tokenizer = load_tokenizer(folder)
    length = max_length or int(meta.get("max_length", 128))
    dev_sets = {s: encode(tokenizer, splits[s], length) for s in task.dev_splits}
    with tempfile.TemporaryDirectory(prefix="posprobe-eval-") as tmp:
        args = training_arguments(tmp, eval_batch_size=batch_size)
        trainer = make_trainer(model, args, tokenizer, progress=False)
        return predict_metrics(trainer, task, dev_sets), mechanism
