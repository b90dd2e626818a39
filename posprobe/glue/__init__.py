"""GLUE fine-tuning and evaluation.

Modules, by job: `tasks` (the task table), `data` (loading and checking splits), `metrics` (SPEC §7),
`config` (`FinetuneConfig`, validated), `runtime` (Trainer plumbing shared by training and evaluation),
`run` (`finetune()`), `evaluation` (`evaluate()`), `report` (aggregates, Markdown, `FinetuneResult`),
`grid` (`finetune_grid()`: tasks x mechanisms x seeds), `grid_report` (SPEC §12 tables, `GridResult`),
`stats` (median, mean, s.e., paired differences, sign-flip p-value; torch-free).

Importing `posprobe.glue` (or `tasks`, `metrics`, `data`, `config`, `report`) never imports torch or
transformers; `finetune`, `evaluate` and `FinetuneResult` are loaded on first use.
"""

from posprobe.glue.tasks import TASKS, GlueTask, get_task

__all__ = [
    "TASKS",
    "GlueTask",
    "get_task",
    "FinetuneConfig",
    "FinetuneResult",
    "GridResult",
    "finetune",
    "finetune_grid",
    "evaluate",
]

_LAZY = {
    "FinetuneConfig": "posprobe.glue.config",
    "FinetuneResult": "posprobe.glue.report",
    "finetune": "posprobe.glue.run",
    "evaluate": "posprobe.glue.evaluation",
    "finetune_grid": "posprobe.glue.grid",
    "GridResult": "posprobe.glue.grid_report",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'posprobe.glue' has no attribute {name!r}")
