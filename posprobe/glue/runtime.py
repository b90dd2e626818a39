"""What fine-tuning and evaluation share: processes, tokenised splits, the one `TrainingArguments` builder,
loading a saved classifier (always through `posprobe.load_model`), prediction, and quiet mode.

torch and transformers are imported inside functions only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from posprobe.errors import ArgumentValueError
from posprobe.glue.data import GlueSplit
from posprobe.glue.metrics import compute_metrics
from posprobe.glue.tasks import GlueTask


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """True on rank 0 (and in a plain single-process run)."""
    return int(os.environ.get("RANK", "0")) == 0


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


def label_kwargs(task: GlueTask) -> dict[str, Any]:
    """`from_pretrained` settings that give a classifier the task's outputs (STS-B: one regression output)."""
    kwargs: dict[str, Any] = {"num_labels": task.num_labels}
    if task.is_regression:
        kwargs["problem_type"] = "regression"
    else:
        kwargs["problem_type"] = "single_label_classification"
        kwargs["id2label"] = dict(enumerate(task.label_names))
        kwargs["label2id"] = {n: i for i, n in enumerate(task.label_names)}
    return kwargs


def training_arguments(
    out_dir: str | Path,
    *,
    seed: int = 0,
    batch_size: int = 32,
    eval_batch_size: int = 64,
    progress: bool = False,
    train: dict[str, Any] | None = None,
):
    """The one place that builds `TrainingArguments`: CPU or GPU, gloo for multi-process CPU runs, no
    reporting integrations, no loss rescaling across processes. `train` holds the training-only settings
    (epochs, lr, schedule, checkpointing); without it the arguments only serve prediction.
    `batch_size` and `eval_batch_size` are totals over all processes."""
    import torch
    from transformers import TrainingArguments

    n = world_size()
    if train is not None and batch_size % n:
        raise ArgumentValueError(
            "batch_size",
            f"{{arg}} {batch_size} is not divisible by the {n} processes",
            f"use a multiple of {n} (it is the total batch size over all processes)",
        )
    cuda = torch.cuda.is_available()
    return TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=max(1, batch_size // n),
        per_device_eval_batch_size=max(1, eval_batch_size // n),
        seed=seed,
        data_seed=seed,
        eval_strategy="no",
        # sentence-level losses are plain batch means: no per-token rescaling across processes (the Trainer
        # would otherwise multiply the loss by the process count for models that accept loss kwargs)
        average_tokens_across_devices=False,
        report_to=[],
        use_cpu=not cuda,
        ddp_backend="gloo" if n > 1 and not cuda else None,
        dataloader_num_workers=0,
        disable_tqdm=not progress,
        **(train or {"save_strategy": "no"}),
    )


def make_trainer(model, args, tokenizer, *, progress: bool, **kwargs):
    """A `Trainer` that prints its log dicts (`{'train_runtime': ...}`) only when `progress` is on."""
    from transformers import DataCollatorWithPadding, Trainer
    from transformers.trainer_callback import PrinterCallback

    trainer = Trainer(
        model=model, args=args, data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer, **kwargs
    )
    if not progress:
        trainer.remove_callback(PrinterCallback)
    return trainer


def close_progress_bars(trainer) -> None:
    """Close the Trainer's progress bars now (after a failure they would otherwise be redrawn at exit, below
    the error line)."""
    for callback in trainer.callback_handler.callbacks:
        for name in ("training_bar", "prediction_bar"):
            bar = getattr(callback, name, None)
            if bar is not None:
                bar.close()
                setattr(callback, name, None)


def predict_metrics(trainer, task: GlueTask, dev_sets: dict[str, EncodedSplit]) -> dict[str, float | None]:
    """Predict every dev split with `trainer` and compute the task's metrics (MNLI: both dev sets).
    NaN (an undefined correlation) becomes None so that results stay valid JSON."""
    metrics: dict[str, float] = {}
    for split, data in dev_sets.items():
        output = trainer.predict(data, metric_key_prefix=split)
        predictions = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
        metrics.update(compute_metrics(task, predictions, output.label_ids, split))
    return {k: (None if v != v else float(v)) for k, v in metrics.items()}


def head_parameters(model) -> list[str]:
    """Names of the parameters outside the base model (the task head: `classifier.*`, `score.*`, ...),
    leaving out retrofitted mechanism parameters."""
    prefix = getattr(model, "base_model_prefix", "") + "."
    return [n for n, _ in model.named_parameters() if not n.startswith(prefix) and "posprobe_mechanisms" not in n]


def missing_head_weights(model, folder: Path) -> list[str]:
    """The head parameters of `model` that the safetensors files in `folder` do not hold: the ones
    transformers initialised at random when it loaded the model."""
    from posprobe.checkpoint.weights import WeightReader

    stored = set(WeightReader(folder, "safetensors").keys())
    return [n for n in head_parameters(model) if n not in stored]


@contextlib.contextmanager
def own_process_group() -> Iterator[None]:
    """Destroy, when the block ends, the torch.distributed process group the block created (the Trainer creates
    one under torchrun); a group that existed before is left to its owner. A gloo group still alive at
    interpreter exit can abort the process ("terminate called without an active exception", SIGABRT)."""
    import torch.distributed as dist

    existed = dist.is_available() and dist.is_initialized()
    ok = False
    try:
        yield
        ok = True
    finally:
        if not existed and dist.is_available() and dist.is_initialized():
            if ok:  # all ranks got here: let them leave together (no barrier after a failure: it could hang)
                dist.barrier()
            dist.destroy_process_group()


def load_classifier(folder: Path, *, allow_new_head: bool = False, allow_pickle: bool = False, **kwargs):
    """A saved sequence classifier, through `posprobe.load_model` (so a retrofitted mechanism comes
    back with it). Refuses a checkpoint without trained head weights unless `allow_new_head`."""
    from transformers import AutoModelForSequenceClassification

    from posprobe.retrofitting.loading import load_model

    model = load_model(str(folder), model_class=AutoModelForSequenceClassification, allow_pickle=allow_pickle, **kwargs)
    if not allow_new_head and any(Path(folder).glob("*.safetensors")):
        missing = missing_head_weights(model, Path(folder))
        if missing:
            raise ArgumentValueError(
                "allow_new_head",
                f"'{folder}' has no trained classification head (missing weights: {', '.join(missing)}); "
                "scoring it would score a randomly initialised head",
                "evaluate a model written by `posprobe finetune`, or pass {arg} to score a new random head anyway",
            )
    return model


@contextlib.contextmanager
def quiet(enabled: bool = True) -> Iterator[None]:
    """Silence transformers' and datasets' logging and progress bars (load reports, 'Writing model shards')
    while the block runs; restores the previous settings."""
    if not enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        import huggingface_hub.utils as hub_utils

        hub_bars = not hub_utils.are_progress_bars_disabled()
        hub_utils.disable_progress_bars()
    except (ImportError, AttributeError):
        hub_utils, hub_bars = None, False
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if hub_utils is not None and hub_bars:
            hub_utils.enable_progress_bars()
