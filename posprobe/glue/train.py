"""Old import path, kept while callers move over: the fine-tuning code now lives in `posprobe.glue.run`
(`finetune`), `posprobe.glue.evaluation` (`evaluate`), `posprobe.glue.config` (`FinetuneConfig`) and
`posprobe.glue.report` (`FinetuneResult`, aggregates). Import from `posprobe.glue` instead."""

from posprobe.glue.config import FinetuneConfig, seed_list
from posprobe.glue.evaluation import evaluate
from posprobe.glue.report import FinetuneResult, aggregate
from posprobe.glue.run import finetune

__all__ = ["FinetuneConfig", "FinetuneResult", "aggregate", "evaluate", "finetune", "seed_list"]
