"""Loading GLUE splits from local files or the Hugging Face hub, checked row by row.

Three sources, tried in this order:

1. `data_dir` in the Hugging Face glue schema: `<data_dir>/<task>/<split>.{jsonl,json,csv,parquet}`
   (e.g. `glue/cola/train.jsonl`, `glue/mnli/validation_matched.jsonl`); `data_dir` may also be the
   task folder itself. Columns: the task's text fields and `label` (`idx` and others are ignored).
2. `data_dir` in the official GLUE TSV layout: `<data_dir>/CoLA/train.tsv`, `.../dev.tsv`,
   `MNLI/dev_matched.tsv`, ... (or the task folder itself). Read with quoting disabled — GLUE text
   contains bare quote characters; string labels (MNLI, QNLI, RTE) are mapped to the HF class ids.
3. No `data_dir`: `datasets.load_dataset("nyu-mll/glue", task)` (needs network or a warm cache).

Malformed input (missing column, wrong field count, a label that is not a number / not a known class)
raises `PosprobeError` naming the file and line. Nothing here imports torch.
"""

from __future__ import annotations

import codecs
import csv
import json
import math
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from posprobe.errors import PosprobeError
from posprobe.glue.tasks import GlueTask, get_task
from posprobe.texts.hub import load_hub_dataset

HF_EXTENSIONS = ("jsonl", "json", "csv", "parquet")
HUB_DATASET = "nyu-mll/glue"
SUBSAMPLE_SEED = 0


@dataclass
class GlueSplit:
    """One labelled split: `texts[i]` is a 1-tuple (single sentence) or 2-tuple (pair); `labels[i]` an
    int class id (a float score for STS-B). `source` says where it came from (file or hub); `total` is the
    size of that source when this is a capped subset of it (None: the whole source)."""

    task: str
    split: str
    texts: list[tuple[str, ...]]
    labels: list[int] | list[float]
    source: str
    total: int | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def describe(self) -> str:
        """'sst2 train: 256 of 8,551 examples from PATH' (or '8,551 examples from PATH')."""
        size = f"{len(self):,} of {self.total:,}" if self.total is not None else f"{len(self):,}"
        return f"{self.task} {self.split}: {size} examples from {self.source}"

    def subset(self, n: int | None, seed: int = SUBSAMPLE_SEED) -> GlueSplit:
        """At most `n` examples: a fixed random subset (same for every training seed), original order kept."""
        if n is None or n >= len(self):
            return self
        if n < 1:
            raise PosprobeError(f"sample cap {n} is below 1", "pass a positive number of examples")
        keep = np.sort(np.random.default_rng(seed).permutation(len(self))[:n])
        return GlueSplit(
            self.task,
            self.split,
            [self.texts[i] for i in keep],
            [self.labels[i] for i in keep],
            self.source,
            total=len(self) if self.total is None else self.total,
        )


# ----------------------------------------------------------------------------------------------------
# public entry points


def load_glue(
    task: str | GlueTask,
    data_dir: str | Path | None = None,
    *,
    splits: Iterable[str] | None = None,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
) -> dict[str, GlueSplit]:
    """Load `train` and every dev split of `task` (or only `splits`), capping sizes if asked."""
    task = get_task(task)
    wanted = list(splits) if splits is not None else list(task.splits)
    for split in wanted:
        if split not in task.splits:
            raise PosprobeError(f"{task.name} has no labelled split '{split}'", f"use one of: {', '.join(task.splits)}")
    if data_dir is None:
        out = _load_from_hub(task, wanted)
    else:
        out = {split: load_split(task, split, data_dir) for split in wanted}
    for split, data in list(out.items()):
        out[split] = data.subset(max_train_samples if split == "train" else max_eval_samples)
    return out


def load_split(task: str | GlueTask, split: str, data_dir: str | Path) -> GlueSplit:
    """Load one split of `task` from `data_dir` (HF-schema files first, then the GLUE TSV layout); `builtin:glue` is
    the packaged sample (`posprobe.corpora.glue_sample_dir`: cola and sst2 only)."""
    from posprobe.corpora import GLUE_SAMPLE, glue_sample_dir

    task = get_task(task)
    root = glue_sample_dir() if str(data_dir) == GLUE_SAMPLE else Path(data_dir).expanduser()
    if not root.is_dir():
        raise PosprobeError(
            f"data folder '{root}' does not exist", "pass --data-dir with the folder that holds the GLUE task folders"
        )
    path = find_split_file(task, split, root)
    if path.suffix == ".tsv":
        return read_tsv(task, split, path)
    return read_hf_file(task, split, path)


def find_split_file(task: GlueTask, split: str, root: Path) -> Path:
    """The file holding `split` of `task` under `root`, or a PosprobeError listing where it looked."""
    folders = _task_folders(task, root)
    candidates = [folder / f"{split}.{ext}" for folder in folders for ext in HF_EXTENSIONS]
    candidates += [folder / task.tsv_files[split] for folder in folders]  # HF-schema files win over TSV
    for path in candidates:
        if path.is_file():
            return path
    hf = f"{root}/{task.name}/{split}.jsonl"
    tsv = f"{root}/{task.tsv_dir}/{task.tsv_files[split]}"
    raise PosprobeError(
        f"no {task.name} '{split}' data under '{root}' (looked for {hf} (or .json/.csv/.parquet) and {tsv})",
        "pass --data-dir with the folder holding <task>/<split>.jsonl files or the official GLUE TSV folders",
    )


def _task_folders(task: GlueTask, root: Path) -> list[Path]:
    names = dict.fromkeys([task.name, task.tsv_dir, task.name.upper(), task.tsv_dir.lower()])  # ordered, unique
    folders = [root / name for name in names if (root / name).is_dir()]
    if root.name.lower().replace("-", "") == task.name:  # data_dir is the task folder itself
        folders.append(root)
    return folders


# ----------------------------------------------------------------------------------------------------
# label and text checks shared by every reader


def _parse_label(task: GlueTask, value: Any, where: str) -> int | float:
    """Check one label and turn it into the HF id (classification) or a float score (STS-B)."""
    if task.is_regression:
        try:
            score = float(value)
        except (TypeError, ValueError):
            raise PosprobeError(
                f"{where}: label {value!r} is not a number", f"{task.name} labels must be similarity scores (0-5)"
            ) from None
        if isinstance(value, bool) or not math.isfinite(score):
            raise PosprobeError(
                f"{where}: label {value!r} is not a finite number",
                f"{task.name} labels must be similarity scores (0-5)",
            )
        return score
    if isinstance(value, str) and task.tsv_label_map and value.strip() in task.tsv_label_map:
        return task.tsv_label_map[value.strip()]
    if isinstance(value, str) and value.strip() in task.label_names:
        return task.label_names.index(value.strip())
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
        if not number.is_integer():
            raise ValueError
        label = int(number)
    except (TypeError, ValueError):
        raise PosprobeError(
            f"{where}: label {value!r} is not a class id of {task.name}",
            f"use integers 0..{task.num_labels - 1} or the names {', '.join(task.label_names)}",
        ) from None
    if not 0 <= label < task.num_labels:
        hint = (
            "test splits have no labels (-1); use train / validation files"
            if label == -1
            else f"{task.name} labels are 0..{task.num_labels - 1}"
        )
        raise PosprobeError(f"{where}: label {label} is out of range", hint)
    return label


def _text(value: Any, column: str, where: str) -> str:
    if not isinstance(value, str):
        raise PosprobeError(
            f"{where}: column '{column}' holds {type(value).__name__} {value!r}, not text",
            "every text column must hold a string",
        )
    return value


# ----------------------------------------------------------------------------------------------------
# official GLUE TSV release


def read_tsv(task: GlueTask, split: str, path: Path) -> GlueSplit:
    """Read one GLUE TSV file (quoting disabled; header or fixed field count checked on every line)."""
    texts: list[tuple[str, ...]] = []
    labels: list = []
    csv.field_size_limit(sys.maxsize)
    reader = csv.reader(_text_lines(path), delimiter="\t", quoting=csv.QUOTE_NONE)
    if task.tsv_header:
        header = next(reader, None)
        if header is None:
            raise PosprobeError(f"{path}: the file is empty", "expected a header line and data lines")
        header = [h.strip() for h in header]
        columns = {name: i for i, name in enumerate(header)}
        missing = [c for c in (*task.tsv_text_columns, task.tsv_label_column) if c not in columns]
        if missing:
            raise PosprobeError(
                f"{path}, line 1: header lacks column(s) {', '.join(map(repr, missing))}",
                f"a {task.tsv_dir} TSV needs columns "
                f"{', '.join(map(str, (*task.tsv_text_columns, task.tsv_label_column)))}",
            )
        text_idx = [columns[c] for c in task.tsv_text_columns]
        label_idx = columns[task.tsv_label_column]
        n_fields = len(header)
    else:
        text_idx = [int(c) for c in task.tsv_text_columns]
        label_idx = int(task.tsv_label_column)
        n_fields = int(task.tsv_num_fields or 0)
    for row in reader:
        where = f"{path}, line {reader.line_num}"
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != n_fields:
            raise PosprobeError(
                f"{where}: {len(row)} tab-separated fields, expected {n_fields}",
                f"fix or remove the line (a {task.tsv_dir} TSV has {n_fields} fields)",
            )
        texts.append(tuple(row[i] for i in text_idx))
        labels.append(_parse_label(task, row[label_idx], where))
    if not labels:
        raise _no_examples(path)
    return GlueSplit(task.name, split, texts, labels, str(path))


def _text_lines(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 text file (line ends kept, a leading BOM dropped), decoded one at a time so that
    bytes that are not UTF-8 are reported with the file and line they are on."""
    try:
        fh = open(path, "rb")
    except OSError as err:
        raise PosprobeError(f"cannot read '{path}' ({err.strerror or err})", "check the file permissions") from err
    with fh:
        for number, raw in enumerate(fh, 1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise PosprobeError(
                    f"{path}, line {number}: bytes that are not UTF-8 ({raw[err.start : err.start + 4]!r} at "
                    f"character {err.start + 1})",
                    "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
                ) from None


def _no_examples(path: Path) -> PosprobeError:
    empty = path.is_file() and path.stat().st_size == 0
    return PosprobeError(
        f"{path}: {'the file is empty' if empty else 'no examples'}",
        "the split needs at least one labelled example (one per line)",
    )


# ----------------------------------------------------------------------------------------------------
# HF glue schema files


def read_hf_file(task: GlueTask, split: str, path: Path) -> GlueSplit:
    """Read one split in the HF glue schema from .jsonl / .json / .csv / .parquet."""
    ext = path.suffix.lstrip(".").lower()
    rows: Iterator[tuple[str, dict]] = {
        "jsonl": _jsonl_rows,
        "json": _json_rows,
        "csv": _csv_rows,
        "parquet": _parquet_rows,
    }[ext](path)
    texts: list[tuple[str, ...]] = []
    labels: list = []
    for where, record in rows:
        if not isinstance(record, dict):
            raise PosprobeError(
                f"{where}: expected an object with fields {', '.join((*task.text_fields, 'label'))}",
                "one JSON object per example",
            )
        missing = [c for c in (*task.text_fields, "label") if c not in record]
        if missing:
            raise PosprobeError(
                f"{where}: missing column(s) {', '.join(map(repr, missing))}",
                f"{task.name} rows need {', '.join((*task.text_fields, 'label'))} (the HF glue schema)",
            )
        texts.append(tuple(_text(record[c], c, where) for c in task.text_fields))
        labels.append(_parse_label(task, record["label"], where))
    if not labels:
        raise _no_examples(path)
    return GlueSplit(task.name, split, texts, labels, str(path))


def _jsonl_rows(path: Path) -> Iterator[tuple[str, dict]]:
    for number, line in enumerate(_text_lines(path), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:  # JSONDecodeError: its own "line 1" would be a second, wrong line number
            detail = f"{err.msg} at column {err.colno}" if isinstance(err, json.JSONDecodeError) else str(err)
            raise PosprobeError(
                f"{path}, line {number}: not valid JSON ({detail})", "JSON lines files hold one JSON object per line"
            ) from None
        yield f"{path}, line {number}", record


def _json_rows(path: Path) -> Iterator[tuple[str, dict]]:
    text = "".join(_text_lines(path))
    try:
        data = json.loads(text)
    except ValueError:
        yield from _jsonl_rows(path)  # .json files written as JSON lines, as `datasets` accepts
        return
    if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
        data = next(iter(data.values()))  # {"data": [...]}
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        lengths = {len(v) for v in data.values()}
        if len(lengths) != 1:
            raise PosprobeError(
                f"{path}: columns have different lengths {sorted(lengths)}",
                "every column must hold one value per example",
            )
        keys = list(data)
        data = [dict(zip(keys, values)) for values in zip(*data.values())]
    if not isinstance(data, list):
        raise PosprobeError(f"{path}: expected a list of objects (or JSON lines)", "write one object per example")
    for number, record in enumerate(data, 1):
        yield f"{path}, record {number}", record


def _csv_rows(path: Path) -> Iterator[tuple[str, dict]]:
    csv.field_size_limit(sys.maxsize)
    reader = csv.reader(_text_lines(path))
    header = next(reader, None)
    if header is None:
        raise PosprobeError(f"{path}: the file is empty", "expected a header line and data lines")
    header = [h.strip() for h in header]
    for row in reader:
        where = f"{path}, line {reader.line_num}"
        if not row:
            continue
        if len(row) != len(header):
            raise PosprobeError(
                f"{where}: {len(row)} comma-separated fields, expected {len(header)}",
                "quote fields that contain commas, or fix the line",
            )
        yield where, dict(zip(header, row))


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        pq = None
    if pq is not None:
        try:
            records = pq.read_table(path).to_pylist()
        except Exception as err:
            raise PosprobeError(f"{path}: not a readable parquet file ({err})", "re-export the split") from err
    else:
        try:
            import datasets
        except ImportError:
            raise PosprobeError(
                f"{path}: reading parquet needs pyarrow or datasets",
                "install one of them, or convert the split to .jsonl",
            ) from None
        records = list(datasets.Dataset.from_parquet(str(path)))
    for number, record in enumerate(records, 1):
        yield f"{path}, row {number}", record


# ----------------------------------------------------------------------------------------------------
# the hub


def _load_from_hub(task: GlueTask, splits: list[str]) -> dict[str, GlueSplit]:
    hint = (
        f"pass --data-dir DIR with DIR/{task.name}/train.jsonl and "
        f"{', '.join(f'DIR/{task.name}/{s}.jsonl' for s in task.dev_splits)} (HF glue schema), "
        f"or the official GLUE TSV folders (DIR/{task.tsv_dir}/train.tsv, ...)"
        + (", or --data-dir builtin:glue (a small packaged sample, not GLUE)" if task.name in ("cola", "sst2") else "")
    )
    loaded = load_hub_dataset(HUB_DATASET, task.name, None, f"GLUE '{task.name}'", hint)
    out: dict[str, GlueSplit] = {}
    for split in splits:
        table = loaded[split]
        where_prefix = f"{HUB_DATASET}/{task.name} [{split}]"
        columns = {c: table[c] for c in (*task.text_fields, "label")}
        texts = [
            tuple(_text(v, c, f"{where_prefix} row {i + 1}") for c, v in zip(task.text_fields, row))
            for i, row in enumerate(zip(*(columns[c] for c in task.text_fields)))
        ]
        labels = [_parse_label(task, v, f"{where_prefix} row {i + 1}") for i, v in enumerate(columns["label"])]
        out[split] = GlueSplit(task.name, split, texts, labels, f"hub:{HUB_DATASET}/{task.name}")
    return out
