"""The GLUE task table: text fields, label sets, dev splits and metrics of every task.

Names and fields follow the Hugging Face `nyu-mll/glue` schema; `tsv_*` describe the official GLUE
TSV release (the folders written by the original download script) so `posprobe.glue.data` can read both.
Metric names (SPEC §7): `matthews`, `accuracy`, `f1`, `pearson`, `spearman`; MNLI reports `accuracy`
for the matched dev set and `accuracy_mismatched` for the mismatched one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from posprobe.errors import PosprobeError


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task.

    `dev_splits` maps each HF dev split name to the suffix its metric names get (MNLI mismatched:
    `_mismatched`); `label_names[i]` is the name of class id `i` (HF ids); `tsv_label_map` turns the
    label strings of the TSV release into those ids (None: the TSV holds the ids / scores directly).
    """

    name: str
    text_fields: tuple[str, ...]
    num_labels: int
    dev_splits: dict[str, str]
    metrics: tuple[str, ...]
    label_names: tuple[str, ...]
    tsv_dir: str
    tsv_files: dict[str, str]
    tsv_header: bool
    tsv_text_columns: tuple[str | int, ...]
    tsv_label_column: str | int
    tsv_num_fields: int | None = None  # required field count where the TSV has no header
    tsv_label_map: dict[str, int] | None = field(default=None)

    @property
    def is_regression(self) -> bool:
        """STS-B: one real-valued output trained with MSE."""
        return self.num_labels == 1

    @property
    def is_pair(self) -> bool:
        return len(self.text_fields) == 2

    @property
    def splits(self) -> tuple[str, ...]:
        """Every split with labels: `train` and the dev split(s)."""
        return ("train", *self.dev_splits)

    def metric_names(self) -> list[str]:
        """All metric names this task reports, dev-split suffixes included (MNLI: matched, mismatched)."""
        return [m + suffix for suffix in self.dev_splits.values() for m in self.metrics]

    @property
    def main_metric(self) -> str:
        return self.metrics[0]


_NLI3 = {"entailment": 0, "neutral": 1, "contradiction": 2}
_NLI2 = {"entailment": 0, "not_entailment": 1}
_DEV = {"validation": ""}
_DEV_FILES = {"train": "train.tsv", "validation": "dev.tsv"}

TASKS: dict[str, GlueTask] = {
    "cola": GlueTask(
        "cola",
        ("sentence",),
        2,
        _DEV,
        ("matthews",),
        ("unacceptable", "acceptable"),
        "CoLA",
        _DEV_FILES,
        tsv_header=False,
        tsv_text_columns=(3,),
        tsv_label_column=1,
        tsv_num_fields=4,
    ),
    "sst2": GlueTask(
        "sst2",
        ("sentence",),
        2,
        _DEV,
        ("accuracy",),
        ("negative", "positive"),
        "SST-2",
        _DEV_FILES,
        tsv_header=True,
        tsv_text_columns=("sentence",),
        tsv_label_column="label",
    ),
    "mrpc": GlueTask(
        "mrpc",
        ("sentence1", "sentence2"),
        2,
        _DEV,
        ("f1", "accuracy"),
        ("not_equivalent", "equivalent"),
        "MRPC",
        _DEV_FILES,
        tsv_header=True,
        tsv_text_columns=("#1 String", "#2 String"),
        tsv_label_column="Quality",
    ),
    "qqp": GlueTask(
        "qqp",
        ("question1", "question2"),
        2,
        _DEV,
        ("f1", "accuracy"),
        ("not_duplicate", "duplicate"),
        "QQP",
        _DEV_FILES,
        tsv_header=True,
        tsv_text_columns=("question1", "question2"),
        tsv_label_column="is_duplicate",
    ),
    "stsb": GlueTask(
        "stsb",
        ("sentence1", "sentence2"),
        1,
        _DEV,
        ("pearson", "spearman"),
        (),
        "STS-B",
        _DEV_FILES,
        tsv_header=True,
        tsv_text_columns=("sentence1", "sentence2"),
        tsv_label_column="score",
    ),
    "mnli": GlueTask(
        "mnli",
        ("premise", "hypothesis"),
        3,
        {"validation_matched": "", "validation_mismatched": "_mismatched"},
        ("accuracy",),
        ("entailment", "neutral", "contradiction"),
        "MNLI",
        {"train": "train.tsv", "validation_matched": "dev_matched.tsv", "validation_mismatched": "dev_mismatched.tsv"},
        tsv_header=True,
        tsv_text_columns=("sentence1", "sentence2"),
        tsv_label_column="gold_label",
        tsv_label_map=_NLI3,
    ),
    "qnli": GlueTask(
        "qnli",
        ("question", "sentence"),
        2,
        _DEV,
        ("accuracy",),
        ("entailment", "not_entailment"),
        "QNLI",
        _DEV_FILES,
        tsv_header=True,
        tsv_text_columns=("question", "sentence"),
        tsv_label_column="label",
        tsv_label_map=_NLI2,
    ),
    "rte": GlueTask(
        "rte",
        ("sentence1", "sentence2"),
        2,
        _DEV,
        ("accuracy",),
        ("entailment", "not_entailment"),
        "RTE",
        _DEV_FILES,
        tsv_header=True,
        tsv_text_columns=("sentence1", "sentence2"),
        tsv_label_column="label",
        tsv_label_map=_NLI2,
    ),
    "wnli": GlueTask(
        "wnli",
        ("sentence1", "sentence2"),
        2,
        _DEV,
        ("accuracy",),
        ("not_entailment", "entailment"),
        "WNLI",
        _DEV_FILES,
        tsv_header=True,
        tsv_text_columns=("sentence1", "sentence2"),
        tsv_label_column="label",
    ),
}

TASK_NAMES: tuple[str, ...] = tuple(TASKS)


def get_task(name: str | GlueTask) -> GlueTask:
    """Look a task up by name (case-insensitive; `SST-2`, `STS-B` spellings accepted)."""
    if isinstance(name, GlueTask):
        return name
    key = str(name).strip().lower().replace("-", "").replace("_", "")
    task = TASKS.get(key)
    if task is None:
        raise PosprobeError(f"unknown GLUE task '{name}'", f"choose one of: {', '.join(TASK_NAMES)}")
    return task
