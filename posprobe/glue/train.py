"""Fine-tune and evaluate sequence classifiers on GLUE with the Hugging Face Trainer.

Layout of a run folder (`--out`):

    run.json                   settings of the run (checked again on --resume)
    seed-<k>/checkpoint-<step>  Trainer checkpoints (model, optimizer, scheduler, RNG states) while training
    seed-<k>/model/            the fine-tuned model + tokenizer + posprobe_glue.json once seed k finished
    seed-<k>/metrics.json      dev metrics of seed k (its presence marks the seed as done)
    results.json, results.md   per-seed metrics and aggregates (median, mean, standard error)

`--resume` skips finished seeds and continues an interrupted one from its last checkpoint; the Trainer
restores optimizer, scheduler, data position and RNG states, so the result equals an uninterrupted run.

Multi-process: the same call works under `torchrun --nproc_per_node=N` (gloo on CPU, NCCL on GPU).
`batch_size` is the *total* batch size per optimiser step: each of N processes gets `batch_size / N`
examples, so 1- and N-process runs take the same steps. Only rank 0 writes files.

torch and transformers are imported inside functions only.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posprobe.errors import PosprobeError
from posprobe.glue.data import GlueSplit, load_glue
from posprobe.glue.metrics import compute_metrics
from posprobe.glue.tasks import GlueTask, get_task
from posprobe.outputs import prepare_out_dir, write_json, write_text

META_FILE = "posprobe_glue.json"
RUN_FILE = "run.json"
# settings that must match when a run is resumed (others, e.g. the seed list, may change)
_RESUME_KEYS = (
    "task",
    "model",
    "mechanism",
    "kernels",
    "init",
    "drop_position_embeddings",
    "radius",
    "epochs",
    "lr",
    "batch_size",
    "max_length",
    "max_train_samples",
    "max_steps",
    "warmup",
    "weight_decay",
    "data_dir",
    "max_eval_samples",
)


@dataclass
class FinetuneConfig:
    """Everything one `posprobe finetune` call needs. `batch_size` is the total batch per step."""

    task: str
    out: Path
    model: str | None = None
    mechanism: str = "none"
    kernels: int = 5
    init: str = "zero"
    drop_position_embeddings: bool = False
    radius: int = 8
    seeds: list[int] = field(default_factory=lambda: [0])
    epochs: float = 3.0
    lr: float = 2e-5
    batch_size: int = 32
    max_length: int = 128
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    data_dir: Path | None = None
    resume: bool = False
    allow_pickle: bool = False
    warmup: float = 0.1  # fraction of the optimiser steps with linear warm-up
    weight_decay: float = 0.01
    max_steps: int = -1  # > 0 overrides epochs (mostly for tests and smoke runs)
    save_steps: int | None = None  # None: a checkpoint at the end of every epoch
    source_mechanism: str | None = None  # set when --model is a checkpoint written by `posprobe retrofit`
    fitted_kernels: str | None = None  # the kernels file `--init fit` fitted for this run
    eval_batch_size: int = 64
    keep_checkpoints: bool = False
    progress: bool = True

    @property
    def installed_mechanism(self) -> str:
        """The mechanism the fine-tuned model carries: the one retrofitted now, or the checkpoint's own."""
        return self.mechanism if self.mechanism != "none" else (self.source_mechanism or "none")

    def settings(self) -> dict[str, Any]:
        """JSON-ready settings (for run.json and results.json)."""
        d = asdict(self)
        d["out"] = str(self.out)
        d["data_dir"] = None if self.data_dir is None else str(self.data_dir)
        return d


# ----------------------------------------------------------------------------------------------------
# small helpers


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """True on rank 0 (and in a plain single-process run)."""
    return int(os.environ.get("RANK", "0")) == 0


def seed_list(seeds: int | None = None, seed: int | None = None) -> list[int]:
    """`--seeds N` -> 0..N-1, `--seed X` -> [X]; both or neither given -> [0] / an error."""
    if seeds is not None and seed is not None:
        raise PosprobeError("--seeds and --seed were both given", "pass --seeds N (seeds 0..N-1) or --seed X")
    if seed is not None:
        if seed < 0:
            raise PosprobeError(f"--seed {seed} is negative", "pass a seed >= 0")
        return [seed]
    if seeds is None:
        return [0]
    if seeds < 1:
        raise PosprobeError(f"--seeds {seeds} is below 1", "pass the number of seeds to run, e.g. --seeds 5")
    return list(range(seeds))


def aggregate(per_seed: Sequence[dict[str, float]]) -> dict[str, dict[str, float | None]]:
    """Median, mean and standard error (sample s.d. / sqrt(n); None for one seed) of every metric, over the
    seeds where it is defined; `n` counts those seeds."""
    names = list(per_seed[0]) if per_seed else []
    out: dict[str, dict[str, float | None]] = {"median": {}, "mean": {}, "stderr": {}, "n": {}}
    for name in names:
        values = [float(m[name]) for m in per_seed if m.get(name) is not None and not _isnan(m[name])]
        out["n"][name] = len(values)  # seeds whose metric was defined (a constant prediction has no correlation)
        if not values:
            out["median"][name] = out["mean"][name] = out["stderr"][name] = None
            continue
        out["median"][name] = float(statistics.median(values))
        out["mean"][name] = float(statistics.fmean(values))
        out["stderr"][name] = float(statistics.stdev(values) / math.sqrt(len(values))) if len(values) > 1 else None
    return out


def _isnan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _clean(metrics: dict[str, float]) -> dict[str, float | None]:
    """NaN (an undefined correlation) becomes None so that results stay valid JSON."""
    return {k: (None if _isnan(float(v)) else float(v)) for k, v in metrics.items()}


def _check_mechanism(config: FinetuneConfig) -> None:
    """Validate mechanism-specific options before any expensive work."""
    if config.save_steps is not None and config.save_steps < 1:
        raise PosprobeError(f"--save-steps {config.save_steps} must be at least 1", "pass e.g. --save-steps 500")
    if config.mechanism == "none":
        if config.drop_position_embeddings or config.init != "zero":
            raise PosprobeError(
                "--drop-position-embeddings and --init need a positional mechanism",
                "pass --mechanism tisa (or another one); with --mechanism none they would be ignored",
            )
        return
    if config.init.startswith("fit") and config.mechanism != "tisa":
        raise PosprobeError(f"--init {config.init} applies to --mechanism tisa only", "use --init zero or random")
    if config.init == "fit":
        pass  # kernels are fitted to the model's own profiles once the model is resolved
    elif config.init.startswith("fit:"):
        path = Path(config.init[4:]).expanduser()
        if not path.is_file():
            raise PosprobeError(
                f"TISA kernels file '{path}' does not exist",
                "pass --init fit:PATH with the file written by `posprobe fit-tisa`",
            )
    elif config.init not in ("zero", "random"):
        raise PosprobeError(f"unknown --init '{config.init}'", "use zero, random or fit:PATH")
    _retrofit_module(config.mechanism)
    names = available_mechanisms()
    if names and config.mechanism not in names:
        raise PosprobeError(f"unknown mechanism '{config.mechanism}'", f"choose one of: {', '.join(names)}")


def _retrofit_module(mechanism: str):
    try:
        import posprobe.retrofit as retrofit_api
    except ImportError as err:
        raise PosprobeError(
            f"mechanism '{mechanism}' needs posprobe.retrofit, which is not available ({err})",
            "use --mechanism none, or install a posprobe build with retrofitting",
        ) from err
    return retrofit_api


def available_mechanisms() -> list[str]:
    """`none` plus every mechanism in `posprobe.mechanisms.REGISTRY` (when that module exists)."""
    try:
        from posprobe.mechanisms import REGISTRY
    except Exception:
        return ["none"]
    return ["none", *sorted(str(name) for name in REGISTRY)]


# ----------------------------------------------------------------------------------------------------
# tokenisation and models


class EncodedSplit:
    """A list-backed torch-style dataset of tokenised examples (dicts of input ids and `label`)."""

    def __init__(self, features: list[dict[str, Any]]):
        self.features = features

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.features[i]


def encode(tokenizer, data: GlueSplit, max_length: int) -> EncodedSplit:
    """Tokenise a split without padding (the collator pads each batch to its longest example)."""
    columns = list(zip(*data.texts))
    enc = tokenizer(*columns, truncation=True, max_length=max_length, padding=False)
    keys = list(enc.keys())
    features = [{k: enc[k][i] for k in keys} | {"label": data.labels[i]} for i in range(len(data))]
    return EncodedSplit(features)


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as err:
        raise PosprobeError(
            f"no usable tokenizer in '{path}' ({type(err).__name__}: {str(err)[:120]})",
            "pass a model folder that also holds the tokenizer files (tokenizer.json / vocab.txt)",
        ) from err


def _label_kwargs(task: GlueTask) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"num_labels": task.num_labels}
    if task.is_regression:
        kwargs["problem_type"] = "regression"
    else:
        kwargs["problem_type"] = "single_label_classification"
        kwargs["id2label"] = dict(enumerate(task.label_names))
        kwargs["label2id"] = {n: i for i, n in enumerate(task.label_names)}
    return kwargs


def build_model(config: FinetuneConfig, task: GlueTask, model_path: Path, weight_format: str, seed: int):
    """The model to fine-tune: a plain classifier (`none`), one retrofitted now with `config.mechanism`, or a
    checkpoint retrofitted earlier (`posprobe retrofit`), whose mechanism is re-installed on loading."""
    from transformers import AutoModelForSequenceClassification

    kwargs = {**_label_kwargs(task), "ignore_mismatched_sizes": True}
    if config.mechanism == "none" and not config.source_mechanism:
        return AutoModelForSequenceClassification.from_pretrained(
            str(model_path), trust_remote_code=False, use_safetensors=weight_format == "safetensors", **kwargs
        )
    api = _retrofit_module(config.mechanism if config.mechanism != "none" else config.source_mechanism)
    model = api.load_model(
        str(model_path), model_class=AutoModelForSequenceClassification, allow_pickle=config.allow_pickle, **kwargs
    )
    if config.source_mechanism:  # already retrofitted: its mechanism came back with it
        return model
    init = f"fit:{config.fitted_kernels}" if config.init == "fit" else config.init
    return api.retrofit(
        model,
        config.mechanism,
        radius=config.radius,
        kernels=config.kernels,
        init=init,
        drop_position_embeddings=config.drop_position_embeddings,
        seed=seed,
    )


def _ddp_backend(cuda: bool) -> str | None:
    """gloo for multi-process CPU runs; None (single process, or let accelerate pick NCCL) otherwise."""
    return "gloo" if world_size() > 1 and not cuda else None


def _training_args(config: FinetuneConfig, out_dir: Path, seed: int):
    import torch
    from transformers import TrainingArguments

    n = world_size()
    if config.batch_size % n:
        raise PosprobeError(
            f"--batch-size {config.batch_size} is not divisible by the {n} processes",
            f"use a multiple of {n} (it is the total batch size over all processes)",
        )
    cuda = torch.cuda.is_available()
    save = (
        {"save_strategy": "epoch"}
        if config.save_steps is None
        else {"save_strategy": "steps", "save_steps": config.save_steps}
    )
    return TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=config.batch_size // n,
        per_device_eval_batch_size=max(1, config.eval_batch_size // n),
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        learning_rate=config.lr,
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup,
        lr_scheduler_type="linear",
        seed=seed,
        data_seed=seed,
        eval_strategy="no",
        logging_strategy="steps",
        logging_steps=50,
        save_total_limit=2,
        # sentence-level losses are plain batch means: no per-token rescaling across processes (the Trainer
        # would otherwise multiply the loss by the process count for models that accept loss kwargs)
        average_tokens_across_devices=False,
        report_to=[],
        use_cpu=not cuda,
        ddp_backend=_ddp_backend(cuda),
        dataloader_num_workers=0,
        disable_tqdm=not config.progress,
        **save,
    )


# ----------------------------------------------------------------------------------------------------
# fine-tuning


def finetune(
    config: FinetuneConfig, *, callbacks: list | None = None, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Fine-tune `config.model` on `config.task` for every seed; returns (and on rank 0 writes) the results.

    The returned dict is the `--json` object: task, mechanism, model, seeds, metrics (one dict per seed),
    median / mean / stderr (dicts by metric), seconds (total), seconds_per_seed, world_size, out, settings.
    `callbacks` are extra `TrainerCallback`s (tests use one to simulate a kill).
    """
    from posprobe.checkpoint.resolve import resolve_model

    say = log or (lambda _msg: None)
    started = time.perf_counter()
    task = get_task(config.task)
    config.task = task.name
    if not config.seeds:
        raise PosprobeError("no seeds to run", "pass --seeds N or --seed X")
    if config.epochs <= 0 and config.max_steps <= 0:
        raise PosprobeError(f"--epochs {config.epochs} must be positive", "pass e.g. --epochs 3")
    for name, value in (("--batch-size", config.batch_size), ("--max-length", config.max_length)):
        if value < 1:
            raise PosprobeError(f"{name} {value} must be at least 1", f"pass a positive {name}")
    if config.lr <= 0:
        raise PosprobeError(f"--lr {config.lr} must be positive", "pass e.g. --lr 2e-5")
    _check_mechanism(config)
    source = resolve_model(config.model, allow_pickle=config.allow_pickle, with_tokenizer=True)
    retrofitted = (source.config.get("posprobe") or {}).get("mechanism")
    if retrofitted and config.mechanism != "none":
        raise PosprobeError(
            f"'{source.name}' is already retrofitted with '{retrofitted}'",
            "fine-tune it with --mechanism none (its mechanism is kept), or start from a plain model",
        )
    config.source_mechanism = retrofitted or None
    out = prepare_out_dir(config.out)
    _check_run_folder(config, out)
    if config.mechanism == "tisa" and config.init == "fit":
        from posprobe.pipelines.fitting import fit_kernels_file

        say(f"fitting S={config.kernels} TISA kernels to the head profiles of {source.name}")
        config.fitted_kernels = str(
            fit_kernels_file(str(source.path), config.kernels, out / "fit-tisa", config.allow_pickle)
        )
    splits = load_glue(
        task, config.data_dir, max_train_samples=config.max_train_samples, max_eval_samples=config.max_eval_samples
    )
    for split, data in splits.items():
        say(f"{task.name} {split}: {len(data):,} examples from {data.source}")
    tokenizer = load_tokenizer(source.path)
    train_set = encode(tokenizer, splits["train"], config.max_length)
    dev_sets = {s: encode(tokenizer, splits[s], config.max_length) for s in task.dev_splits}
    if is_main_process():
        write_json(
            out / RUN_FILE, {"posprobe_run": "glue-finetune", **config.settings(), "model_path": str(source.path)}
        )

    per_seed: list[dict[str, float | None]] = []
    seconds: list[float] = []
    for seed in config.seeds:
        metrics, elapsed = _run_seed(config, task, source, tokenizer, train_set, dev_sets, seed, out, callbacks, say)
        per_seed.append(metrics)
        seconds.append(elapsed)
        say(f"seed {seed}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in metrics.items()))

    result: dict[str, Any] = {
        "task": task.name,
        "mechanism": config.installed_mechanism,
        "model": source.name,
        "seeds": list(config.seeds),
        "metrics": per_seed,
        **aggregate(per_seed),
        "seconds": time.perf_counter() - started,
        "seconds_per_seed": seconds,
        "world_size": world_size(),
        "out": str(out),
        "settings": config.settings(),
    }
    if is_main_process():
        write_json(out / "results.json", result)
        write_text(out / "results.md", results_markdown(result))
    return result


def _check_run_folder(config: FinetuneConfig, out: Path) -> None:
    """Refuse to overwrite a previous run unless --resume; on --resume, insist on the same settings."""
    previous = [
        p for p in out.glob("seed-*") if p.is_dir() and (any(p.glob("checkpoint-*")) or (p / "metrics.json").exists())
    ]
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
        changed = [k for k in _RESUME_KEYS if k in old and old[k] != new[k]]
        if changed:
            k = changed[0]
            raise PosprobeError(
                f"--resume with different settings than the run in '{out}' ({k}: {old[k]!r} there, {new[k]!r} now)",
                "resume with the original options, or start a new run with another --out",
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
) -> tuple[dict[str, float | None], float]:
    """Train and evaluate one seed (or reuse its finished result on --resume): (metrics, seconds)."""
    from transformers import DataCollatorWithPadding, Trainer, set_seed
    from transformers.trainer_utils import get_last_checkpoint

    seed_dir = out / f"seed-{seed}"
    done_file = seed_dir / "metrics.json"
    if config.resume and done_file.is_file():
        say(f"seed {seed}: already finished, reusing {done_file}")
        try:
            saved = json.loads(done_file.read_text())
            return dict(saved["metrics"]), float(saved.get("seconds", 0.0))
        except (ValueError, KeyError, TypeError) as err:
            raise PosprobeError(
                f"'{done_file}' is damaged ({err})",
                f"delete {seed_dir} to rerun seed {seed}, or rerun without --resume",
            ) from err
    last = get_last_checkpoint(str(seed_dir)) if config.resume and seed_dir.is_dir() else None
    if config.resume:
        say(f"seed {seed}: resuming from {last}" if last else f"seed {seed}: no checkpoint yet, starting fresh")

    started = time.perf_counter()
    set_seed(seed)  # the classifier head (and retrofitted parameters) are initialised from this seed
    model = build_model(config, task, source.path, source.weight_format, seed)
    args = _training_args(config, seed_dir, seed)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_set,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        callbacks=list(callbacks or []),
    )
    trainer.train(resume_from_checkpoint=last)
    metrics = evaluate_trainer(trainer, task, dev_sets)
    elapsed = time.perf_counter() - started

    model_dir = seed_dir / "model"
    _save_model(trainer, config, model_dir)
    if is_main_process():
        meta = {
            "task": task.name,
            "mechanism": config.installed_mechanism,
            "seed": seed,
            "base_model": source.name,
            "max_length": config.max_length,
            "metrics": metrics,
        }
        write_json(model_dir / META_FILE, meta)
        write_json(done_file, {"seed": seed, "metrics": metrics, "seconds": elapsed})
        if not config.keep_checkpoints:
            for ckpt in seed_dir.glob("checkpoint-*"):
                shutil.rmtree(ckpt, ignore_errors=True)
    return metrics, elapsed


def _save_model(trainer, config: FinetuneConfig, model_dir: Path) -> None:
    if config.installed_mechanism == "none":
        trainer.save_model(str(model_dir))  # rank-aware; also saves the tokenizer
        if is_main_process():  # the Trainer adds its pickled arguments; the model folder needs no pickle
            (model_dir / "training_args.bin").unlink(missing_ok=True)
        return
    if is_main_process():
        api = _retrofit_module(config.installed_mechanism)
        api.save_retrofitted(trainer.model, str(model_dir))
        trainer.processing_class.save_pretrained(str(model_dir))


def evaluate_trainer(trainer, task: GlueTask, dev_sets: dict[str, EncodedSplit]) -> dict[str, float | None]:
    """Predict every dev split with `trainer` and compute the task's metrics (MNLI: both dev sets)."""
    metrics: dict[str, float] = {}
    for split, data in dev_sets.items():
        output = trainer.predict(data, metric_key_prefix=split)
        predictions = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
        metrics.update(compute_metrics(task, predictions, output.label_ids, split))
    return _clean(metrics)


# ----------------------------------------------------------------------------------------------------
# re-evaluation of saved models


def evaluate(
    model_dir: str | Path,
    task: str | GlueTask,
    data_dir: str | Path | None = None,
    *,
    max_eval_samples: int | None = None,
    batch_size: int = 64,
    max_length: int | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Re-evaluate fine-tuned model(s) on the dev split(s) of `task`.

    `model_dir` is either one saved model (a folder with config.json, e.g. `<run>/seed-0/model`) or a
    whole run folder (`--out` of finetune), whose `seed-*/model` folders are all evaluated and
    aggregated. Returns {task, mechanism, model, seeds, metrics (one dict per model), median, mean,
    stderr, seconds, models (their folders)}.
    """
    say = log or (lambda _msg: None)
    started = time.perf_counter()
    task = get_task(task)
    root = Path(model_dir).expanduser()
    if (root / "config.json").is_file():
        folders = [root]
    else:
        folders = sorted(
            (p for p in root.glob("seed-*/model") if (p / "config.json").is_file()), key=lambda p: _seed_of(p.parent)
        )
    if not folders:
        raise PosprobeError(
            f"'{root}' holds no fine-tuned model (no config.json, no seed-*/model)",
            "pass a folder written by `posprobe finetune --out DIR` (or its seed-*/model)",
        )
    splits = load_glue(task, data_dir, splits=list(task.dev_splits), max_eval_samples=max_eval_samples)
    for split, data in splits.items():
        say(f"{task.name} {split}: {len(data):,} examples from {data.source}")
    per_model: list[dict[str, float | None]] = []
    seeds: list[int | None] = []
    mechanisms: set[str] = set()
    for folder in folders:
        meta = _read_meta(folder)
        if meta.get("task") not in (None, task.name):
            say(f"note: {folder} was fine-tuned on {meta['task']}, evaluating on {task.name}")
        mechanisms.add(str(meta.get("mechanism", "none")))
        metrics = _evaluate_folder(folder, task, splits, meta, batch_size, max_length)
        say(f"{folder}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in metrics.items()))
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


def _evaluate_folder(
    folder: Path,
    task: GlueTask,
    splits: dict[str, GlueSplit],
    meta: dict[str, Any],
    batch_size: int,
    max_length: int | None,
) -> dict[str, float | None]:
    import tempfile

    import torch
    from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding, Trainer, TrainingArguments

    mechanism = str(meta.get("mechanism", "none"))
    if mechanism == "none":
        if not any(folder.glob("*.safetensors")):
            raise PosprobeError(
                f"'{folder}' has no safetensors weights", "pass a folder written by `posprobe finetune`"
            )
        model = AutoModelForSequenceClassification.from_pretrained(
            str(folder), use_safetensors=True, trust_remote_code=False
        )
    else:
        api = _retrofit_module(mechanism)
        model = api.load_model(str(folder), model_class=AutoModelForSequenceClassification)
    if model.config.num_labels != task.num_labels:
        raise PosprobeError(
            f"'{folder}' has {model.config.num_labels} output(s) but {task.name} needs {task.num_labels}",
            "evaluate on the task the model was fine-tuned on",
        )
    tokenizer = load_tokenizer(folder)
    length = max_length or int(meta.get("max_length", 128))
    dev_sets = {s: encode(tokenizer, splits[s], length) for s in task.dev_splits}
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="posprobe-eval-") as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            per_device_eval_batch_size=max(1, batch_size // world_size()),
            report_to=[],
            use_cpu=not cuda,
            ddp_backend=_ddp_backend(cuda),
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model, args=args, data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer
        )
        return evaluate_trainer(trainer, task, dev_sets)


# ----------------------------------------------------------------------------------------------------
# reporting


def _fmt(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def results_markdown(result: dict[str, Any]) -> str:
    """A Markdown table: one row per seed, then median and mean ± s.e. (metrics as fractions)."""
    names = list(result["metrics"][0]) if result["metrics"] else []
    lines = [
        f"# GLUE {result['task']} — mechanism `{result['mechanism']}`",
        "",
        f"Model: `{result.get('model')}`; seeds: {', '.join(map(str, result['seeds']))}; "
        f"wall time {result['seconds']:.1f} s. Metrics are fractions (x100 for the usual percentages).",
        "",
        "| seed | " + " | ".join(names) + " | seconds |",
        "|---|" + "---|" * len(names) + "---|",
    ]
    times = result.get("seconds_per_seed") or [None] * len(result["seeds"])
    for seed, metrics, secs in zip(result["seeds"], result["metrics"], times):
        lines.append(
            f"| {seed} | "
            + " | ".join(_fmt(metrics.get(n)) for n in names)
            + f" | {'' if secs is None else f'{secs:.1f}'} |"
        )
    lines.append("| median | " + " | ".join(_fmt(result["median"].get(n)) for n in names) + " | |")
    lines.append(
        "| mean ± s.e. | "
        + " | ".join(f"{_fmt(result['mean'].get(n))} ± {_fmt(result['stderr'].get(n))}" for n in names)
        + " | |"
    )
    lines.append("| seeds counted | " + " | ".join(str(_counted(result, n)) for n in names) + " | |")
    return "\n".join(lines) + "\n"


def _counted(result: dict[str, Any], name: str) -> int:
    """Seeds whose `name` was defined (an undefined correlation, from constant predictions, is left out)."""
    return int(result.get("n", {}).get(name, len(result["metrics"])))


def results_table(result: dict[str, Any]):
    """The same table as a rich Table (for stderr)."""
    from rich.table import Table

    names = list(result["metrics"][0]) if result["metrics"] else []
    table = Table(title=f"GLUE {result['task']} — {result['mechanism']}")
    table.add_column("seed")
    for n in names:
        table.add_column(n, justify="right")
    for seed, metrics in zip(result["seeds"], result["metrics"]):
        table.add_row(str(seed), *(_fmt(metrics.get(n)) for n in names))
    table.add_row("median", *(_fmt(result["median"].get(n)) for n in names), style="bold")
    table.add_row("mean ± s.e.", *(f"{_fmt(result['mean'].get(n))} ± {_fmt(result['stderr'].get(n))}" for n in names))
    table.add_row("seeds counted", *(str(_counted(result, n)) for n in names))
    return table
