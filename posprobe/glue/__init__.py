"""GLUE fine-tuning and evaluation: task table, metrics, data loading and the Trainer loop.

Importing `posprobe.glue` (or its `tasks`, `metrics`, `data` modules) never imports torch or
transformers; only `posprobe.glue.train` does, and only inside its functions.
"""

from posprobe.glue.tasks import TASKS, GlueTask, get_task

__all__ = ["TASKS", "GlueTask", "get_task"]
