"""The settings of a fine-tuning run (`FinetuneConfig`), each validated once, when the config is built.

Errors are `ArgumentTypeError` / `ArgumentValueError` naming the field (`epochs`); the CLI shows the flag
(`--epochs`). Nothing here imports torch or transformers.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posprobe.errors import ArgumentTypeError, ArgumentValueError, PosprobeError
from posprobe.glue.tasks import TASK_NAMES, get_task
from posprobe.validation import as_bool, as_float, as_int, as_int_list, as_path

# settings that must match when a run is resumed (others, e.g. the seed list, may change)
RESUME_KEYS = (
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
    """Everything one fine-tuning run needs; every field is checked when the config is built.

    `batch_size` is the total batch per optimiser step (split over processes under torchrun); `warmup` the
    fraction of optimiser steps with linear warm-up; `max_steps > 0` overrides `epochs`; `save_steps=None`
    saves a resume checkpoint at the end of every epoch. `model=None` is the packaged all-MiniLM-L6-v2.
    """

    task: str
    out: Path | None = None  # None: posprobe-out/finetune/<model label>/<task>-<mechanism>, as the CLI
    model: str | None = None
    mechanism: str = "none"
    kernels: int | None = None  # TISA's S; None: 5, or the S of a fit:FILE kernels file
    init: str = "zero"
    drop_position_embeddings: bool = False
    radius: int | None = None  # clip radius of the relative mechanisms; None: 8
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
    warmup: float = 0.1
    weight_decay: float = 0.01
    max_steps: int = -1
    save_steps: int | None = None
    eval_batch_size: int = 64
    keep_checkpoints: bool = False
    # filled in by the run, not by the caller
    source_mechanism: str | None = field(default=None, init=False)  # the checkpoint is already retrofitted
    fitted_kernels: str | None = field(default=None, init=False)  # the kernels file `init="fit"` fitted

    def __post_init__(self) -> None:
        task = self.task
        if not isinstance(task, str) and not hasattr(task, "name"):
            raise ArgumentTypeError("task", f"{{arg}} must be a GLUE task name, got {task!r}")
        try:
            self.task = get_task(task).name
        except PosprobeError:
            raise ArgumentValueError(
                "task", f"unknown GLUE task '{task}'", f"choose one of: {', '.join(TASK_NAMES)}"
            ) from None
        if self.model is not None:
            if not isinstance(self.model, (str, os.PathLike)):
                raise ArgumentTypeError(
                    "model", f"{{arg}} must be a hub id or a folder, got {self.model!r}", flag="MODEL"
                )
            self.model = str(self.model)
        if not isinstance(self.mechanism, str):
            raise ArgumentTypeError("mechanism", f"{{arg}} must be a mechanism name, got {self.mechanism!r}")
        if self.out is None:
            self.out = default_run_folder(self.model, self.task, self.mechanism)
        self.out = as_path(self.out, "out")
        self.drop_position_embeddings = as_bool(self.drop_position_embeddings, "drop_position_embeddings")
        self.radius, self.kernels = check_mechanism_options(
            self.mechanism, self.radius, self.kernels, self.init, self.drop_position_embeddings
        )
        self.seeds = as_int_list(self.seeds, "seeds", minimum=0, allow_none=False)
        self.epochs = as_float(self.epochs, "epochs", positive=True, hint="e.g. 3")
        self.max_steps = as_int(self.max_steps, "max_steps", minimum=-1)
        if self.max_steps == 0:
            raise ArgumentValueError("max_steps", "{arg} must be positive (or -1: train for `epochs`)")
        self.lr = as_float(self.lr, "lr", positive=True, hint="e.g. 2e-5")
        self.batch_size = as_int(self.batch_size, "batch_size", minimum=1)
        self.max_length = as_int(self.max_length, "max_length", minimum=2)
        for name in ("max_train_samples", "max_eval_samples", "save_steps"):
            if getattr(self, name) is not None:
                setattr(self, name, as_int(getattr(self, name), name, minimum=1))
        self.data_dir = None if self.data_dir is None else as_path(self.data_dir, "data_dir")
        self.resume = as_bool(self.resume, "resume")
        self.allow_pickle = as_bool(self.allow_pickle, "allow_pickle")
        self.keep_checkpoints = as_bool(self.keep_checkpoints, "keep_checkpoints")
        self.warmup = as_float(self.warmup, "warmup", minimum=0, maximum=0.999)
        self.weight_decay = as_float(self.weight_decay, "weight_decay", minimum=0)
        self.eval_batch_size = as_int(self.eval_batch_size, "eval_batch_size", minimum=1)

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


def default_model_folder(model: str | None) -> Path:
    """`posprobe-out/finetune/<model label>`: the CLI's default output rule, with the model's label worked out
    without loading anything (a local folder's own name, a hub id as given)."""
    from posprobe.checkpoint.resolve import DEFAULT_MODEL_NAME, ModelSource
    from posprobe.formats.writing import default_out

    source = ModelSource(model or DEFAULT_MODEL_NAME, Path(model or "."), {}, "safetensors")
    return default_out("finetune", source.label)


def default_run_folder(model: str | None, task: str, mechanism: str) -> Path:
    """`posprobe-out/finetune/<model label>/<task>-<mechanism>`."""
    return default_model_folder(model) / f"{get_task(task).name}-{mechanism}"


def check_mechanism_options(
    mechanism: str, radius: int | None, kernels: int | None, init: str, drop_position_embeddings: bool
) -> tuple[int | None, int | None]:
    """Validate the positional-mechanism settings cheaply (no model is loaded; a fit:FILE kernels file is read
    and checked) with the one validation `retrofit` uses (`posprobe.mechanisms.check_settings`). Returns
    (radius, kernels) with the defaults filled in (S from a kernels file); unchanged for `none`."""
    from posprobe.mechanisms import check_kernels, check_radius, check_settings

    if not isinstance(mechanism, str):
        raise ArgumentTypeError("mechanism", f"{{arg}} must be a mechanism name, got {mechanism!r}")
    if mechanism != "none":
        settings = check_settings(mechanism, radius=radius, kernels=kernels, init=init)
        return settings.radius, settings.kernels
    names = available_mechanisms()
    if mechanism not in names:
        raise ArgumentValueError("mechanism", f"unknown mechanism '{mechanism}'", f"choose one of: {', '.join(names)}")
    if drop_position_embeddings or init != "zero":
        raise PosprobeError(
            "--drop-position-embeddings and --init need a positional mechanism",
            "pass --mechanism tisa (or another one); with --mechanism none they would be ignored",
        )
    return (
        None if radius is None else check_radius(radius),
        None if kernels is None else check_kernels(kernels),
    )


def available_mechanisms() -> list[str]:
    """`none` plus every mechanism of the catalogue (torch-free)."""
    from posprobe.mechanisms import MECHANISM_NAMES

    return ["none", *MECHANISM_NAMES]


def seed_list(seeds: int | None = None, seed: int | None = None) -> list[int]:
    """`--seeds N` -> 0..N-1, `--seed X` -> [X]; neither -> [0]; both -> an error."""
    if seeds is not None and seed is not None:
        raise PosprobeError("--seeds and --seed were both given", "pass --seeds N (seeds 0..N-1) or --seed X")
    if seed is not None:
        return [as_int(seed, "seed", minimum=0)]
    if seeds is None:
        return [0]
    return list(range(as_int(seeds, "seeds", minimum=1, hint="the number of seeds to run, e.g. 5")))
