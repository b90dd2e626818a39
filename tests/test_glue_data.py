"""GLUE loading: the task table, both file layouts (HF schema and official TSV), caps and error messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posprobe.errors import PosprobeError
from posprobe.glue.data import load_glue, load_split
from posprobe.glue.tasks import TASKS, get_task

ROOT = Path(__file__).resolve().parents[1]
SHARED_GLUE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "glue"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_tsv(path: Path, lines: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(line) + "\n" for line in lines))
    return path


# ----------------------------------------------------------------------------------------------------
# task table


def test_task_table():
    assert set(TASKS) == {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"}
    assert get_task("SST-2").name == "sst2" and get_task("STS-B").name == "stsb"
    assert get_task("stsb").is_regression and get_task("stsb").num_labels == 1
    assert get_task("mnli").num_labels == 3
    assert get_task("qqp").text_fields == ("question1", "question2")
    assert get_task("qnli").text_fields == ("question", "sentence")
    assert get_task("mnli").text_fields == ("premise", "hypothesis")
    assert get_task("cola").metric_names() == ["matthews"]
    assert get_task("mrpc").metric_names() == ["f1", "accuracy"]
    assert get_task("stsb").metric_names() == ["pearson", "spearman"]
    assert get_task("mnli").metric_names() == ["accuracy", "accuracy_mismatched"]
    assert get_task("mnli").splits == ("train", "validation_matched", "validation_mismatched")


def test_bad_task_name_lists_valid_names():
    with pytest.raises(PosprobeError) as err:
        get_task("colaa")
    assert "unknown GLUE task 'colaa'" in err.value.message
    assert "cola" in err.value.hint and "wnli" in err.value.hint


# ----------------------------------------------------------------------------------------------------
# HF glue schema files


def test_hf_jsonl_single_sentence(tmp_path):
    write_jsonl(
        tmp_path / "cola" / "train.jsonl",
        [{"sentence": "a b", "label": 1, "idx": 0}, {"sentence": "b a", "label": 0, "idx": 1}],
    )
    write_jsonl(tmp_path / "cola" / "validation.jsonl", [{"sentence": "c", "label": 1, "idx": 0}])
    data = load_glue("cola", tmp_path)
    assert list(data) == ["train", "validation"]
    assert data["train"].texts == [("a b",), ("b a",)] and data["train"].labels == [1, 0]
    assert len(data["validation"]) == 1
    # the task folder itself also works as --data-dir
    assert load_split("cola", "train", tmp_path / "cola").labels == [1, 0]


def test_hf_mnli_two_dev_sets_and_pairs(tmp_path):
    row = {"premise": "p", "hypothesis": "h", "label": 2, "idx": 0}
    for split in ("train", "validation_matched", "validation_mismatched"):
        write_jsonl(tmp_path / "mnli" / f"{split}.jsonl", [row, {**row, "label": 0}])
    data = load_glue("mnli", tmp_path)
    assert set(data) == {"train", "validation_matched", "validation_mismatched"}
    assert data["validation_mismatched"].texts == [("p", "h"), ("p", "h")]
    assert data["train"].labels == [2, 0]


def test_hf_csv_json_parquet_and_regression(tmp_path):
    folder = tmp_path / "stsb"
    folder.mkdir()
    (folder / "train.csv").write_text('sentence1,sentence2,label,idx\n"a, b",c,4.5,0\nd,e,0,1\n')
    (folder / "validation.json").write_text(json.dumps([{"sentence1": "x", "sentence2": "y", "label": 3.25}]))
    data = load_glue("stsb", tmp_path)
    assert data["train"].texts == [("a, b", "c"), ("d", "e")]
    assert data["train"].labels == [4.5, 0.0]
    assert data["validation"].labels == [3.25]
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(
        pa.table({"question1": ["q1", "q2"], "question2": ["r1", "r2"], "label": [0, 1], "idx": [0, 1]}),
        tmp_path / "train.parquet",
    )
    qqp = tmp_path / "qqp"
    qqp.mkdir()
    (tmp_path / "train.parquet").rename(qqp / "train.parquet")
    got = load_split("qqp", "train", tmp_path)
    assert got.texts == [("q1", "r1"), ("q2", "r2")] and got.labels == [0, 1]


def test_caps_take_a_fixed_subset(tmp_path):
    rows = [{"sentence": f"s{i}", "label": i % 2, "idx": i} for i in range(50)]
    write_jsonl(tmp_path / "sst2" / "train.jsonl", rows)
    write_jsonl(tmp_path / "sst2" / "validation.jsonl", rows)
    a = load_glue("sst2", tmp_path, max_train_samples=10, max_eval_samples=5)
    b = load_glue("sst2", tmp_path, max_train_samples=10, max_eval_samples=5)
    assert len(a["train"]) == 10 and len(a["validation"]) == 5
    assert a["train"].texts == b["train"].texts  # same subset every time (independent of training seed)
    idx = [int(t[0][1:]) for t in a["train"].texts]
    assert idx == sorted(idx)  # original order kept
    with pytest.raises(PosprobeError, match="below 1"):
        load_glue("sst2", tmp_path, max_train_samples=0)


# ----------------------------------------------------------------------------------------------------
# official GLUE TSV layout


def test_tsv_cola_no_header_and_quotes(tmp_path):
    write_tsv(
        tmp_path / "CoLA" / "train.tsv", [["gj04", "1", "", 'he said "hi" to me'], ["gj04", "0", "*", "me said he's"]]
    )
    write_tsv(tmp_path / "CoLA" / "dev.tsv", [["gj04", "1", "", 'ok "quote']])
    data = load_glue("cola", tmp_path)
    assert data["train"].texts == [('he said "hi" to me',), ("me said he's",)]
    assert data["train"].labels == [1, 0]
    assert data["validation"].texts == [('ok "quote',)]


def test_tsv_sst2_mrpc_stsb_qqp(tmp_path):
    write_tsv(tmp_path / "SST-2" / "train.tsv", [["sentence", "label"], ["nice film", "1"]])
    assert load_split("sst2", "train", tmp_path).texts == [("nice film",)]
    mrpc = tmp_path / "MRPC" / "train.tsv"
    mrpc.parent.mkdir()
    mrpc.write_text("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t11\t12\tA b .\tA c .\n", encoding="utf-8")
    got = load_split("mrpc", "train", tmp_path)
    assert got.texts == [("A b .", "A c .")] and got.labels == [1]
    header = [
        "index",
        "genre",
        "filename",
        "year",
        "old_index",
        "source1",
        "source2",
        "sentence1",
        "sentence2",
        "score",
    ]
    write_tsv(tmp_path / "STS-B" / "dev.tsv", [header, ["0", "g", "f", "2012", "1", "s", "s", "x y", "y x", "3.800"]])
    got = load_split("stsb", "validation", tmp_path)
    assert got.texts == [("x y", "y x")] and got.labels == [3.8]
    write_tsv(
        tmp_path / "QQP" / "train.tsv",
        [["id", "qid1", "qid2", "question1", "question2", "is_duplicate"], ["0", "1", "2", "why?", "how?", "0"]],
    )
    assert load_split("qqp", "train", tmp_path).texts == [("why?", "how?")]


def test_tsv_nli_label_strings(tmp_path):
    header = [
        "index",
        "promptID",
        "pairID",
        "genre",
        "sentence1_binary_parse",
        "sentence2_binary_parse",
        "sentence1_parse",
        "sentence2_parse",
        "sentence1",
        "sentence2",
        "label1",
        "gold_label",
    ]
    dev_header = header[:-1] + ["label2", "label3", "label4", "label5", "gold_label"]
    rows = [
        ["0", "1", "2", "g", "(", "(", "(", "(", "P.", "H.", "neutral", "neutral"],
        ["1", "1", "2", "g", "(", "(", "(", "(", "P2", "H2", "entailment", "contradiction"],
    ]
    write_tsv(tmp_path / "MNLI" / "train.tsv", [header, *rows])
    dev_rows = [r[:-1] + ["x", "x", "x", "x", r[-1]] for r in rows]
    write_tsv(tmp_path / "MNLI" / "dev_matched.tsv", [dev_header, *dev_rows])
    write_tsv(tmp_path / "MNLI" / "dev_mismatched.tsv", [dev_header, dev_rows[0]])
    data = load_glue("mnli", tmp_path)
    assert data["train"].labels == [1, 2]  # neutral=1, contradiction=2
    assert data["train"].texts == [("P.", "H."), ("P2", "H2")]
    assert data["validation_matched"].labels == [1, 2]
    assert data["validation_mismatched"].labels == [1]
    write_tsv(
        tmp_path / "QNLI" / "train.tsv",
        [
            ["index", "question", "sentence", "label"],
            ["0", "q?", "s.", "not_entailment"],
            ["1", "q", "s", "entailment"],
        ],
    )
    assert load_split("qnli", "train", tmp_path).labels == [1, 0]
    write_tsv(
        tmp_path / "RTE" / "train.tsv", [["index", "sentence1", "sentence2", "label"], ["0", "a", "b", "entailment"]]
    )
    assert load_split("rte", "train", tmp_path).labels == [0]
    write_tsv(tmp_path / "WNLI" / "train.tsv", [["index", "sentence1", "sentence2", "label"], ["0", "a", "b", "1"]])
    assert load_split("wnli", "train", tmp_path).labels == [1]


# ----------------------------------------------------------------------------------------------------
# malformed data: file and line in the message


def test_tsv_wrong_field_count_names_file_and_line(tmp_path):
    path = write_tsv(
        tmp_path / "CoLA" / "train.tsv", [["s", "1", "", "ok"], ["s", "0", "*", "ok"], ["s", "1", "bad line"]]
    )
    with pytest.raises(PosprobeError) as err:
        load_split("cola", "train", tmp_path)
    assert str(path) in err.value.message and "line 3" in err.value.message
    assert "3 tab-separated fields, expected 4" in err.value.message


def test_tsv_missing_header_column(tmp_path):
    write_tsv(tmp_path / "SST-2" / "train.tsv", [["text", "label"], ["x", "1"]])
    with pytest.raises(PosprobeError, match=r"line 1: header lacks column\(s\) 'sentence'"):
        load_split("sst2", "train", tmp_path)


def test_tsv_unknown_label_string(tmp_path):
    path = write_tsv(
        tmp_path / "RTE" / "train.tsv",
        [["index", "sentence1", "sentence2", "label"], ["0", "a", "b", "entailment"], ["1", "a", "b", "maybe"]],
    )
    with pytest.raises(PosprobeError) as err:
        load_split("rte", "train", tmp_path)
    assert f"{path}, line 3" in err.value.message and "'maybe'" in err.value.message


def test_jsonl_missing_column_and_bad_labels(tmp_path):
    path = write_jsonl(tmp_path / "sst2" / "train.jsonl", [{"sentence": "a", "label": 1}, {"sentence": "b"}])
    with pytest.raises(PosprobeError) as err:
        load_split("sst2", "train", tmp_path)
    assert f"{path}, line 2" in err.value.message and "'label'" in err.value.message
    write_jsonl(path, [{"sentence": "a", "label": "one"}])
    with pytest.raises(PosprobeError, match=r"line 1: label 'one' is not a class id"):
        load_split("sst2", "train", tmp_path)
    write_jsonl(path, [{"sentence": "a", "label": -1}])
    with pytest.raises(PosprobeError) as err:
        load_split("sst2", "train", tmp_path)
    assert "out of range" in err.value.message and "test splits" in err.value.hint
    write_jsonl(path, [{"sentence": None, "label": 1}])
    with pytest.raises(PosprobeError, match="not text"):
        load_split("sst2", "train", tmp_path)
    path.write_text('{"sentence": "a", "label": 1}\n{broken\n')
    with pytest.raises(PosprobeError, match=r"line 2: not valid JSON \(Expecting property name .* at column 2\) —"):
        load_split("sst2", "train", tmp_path)


def test_regression_label_must_be_numeric(tmp_path):
    path = tmp_path / "stsb" / "train.csv"
    path.parent.mkdir()
    path.write_text("sentence1,sentence2,label\na,b,4.0\na,b,high\n")
    with pytest.raises(PosprobeError) as err:
        load_split("stsb", "train", tmp_path)
    assert f"{path}, line 3" in err.value.message and "not a number" in err.value.message


def test_missing_files_and_folder(tmp_path):
    with pytest.raises(PosprobeError) as err:
        load_glue("rte", tmp_path)
    assert "no rte 'train' data" in err.value.message and "RTE/train.tsv" in err.value.message
    with pytest.raises(PosprobeError, match="does not exist"):
        load_glue("rte", tmp_path / "nope")
    with pytest.raises(PosprobeError, match="no labelled split 'test'"):
        load_glue("rte", tmp_path, splits=["test"])


@pytest.mark.slow  # a child process importing datasets
def test_offline_without_data_dir_says_how_to_pass_data(tmp_path):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets"),
    }
    code = (
        "from posprobe.glue.data import load_glue\n"
        "from posprobe.errors import PosprobeError\n"
        "try:\n    load_glue('rte')\nexcept PosprobeError as e:\n    print('ERR', e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.stdout.startswith("ERR could not load GLUE 'rte' from the Hugging Face hub"), proc.stderr[-2000:]
    assert "--data-dir" in proc.stdout and "rte/train.jsonl" in proc.stdout


@pytest.mark.slow  # a child process importing datasets (2 s)
def test_unreachable_hub_fails_at_once_with_one_line(tmp_path):
    """No offline variable set and no network (here: an endpoint whose port refuses connections): one quick
    failed connection decides it; no retry lines with back-off (25 s before the fix)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env |= {
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets"),
        "PYTHONPATH": str(ROOT),
    }
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "posprobe", "finetune", "--task", "rte", "--out", str(tmp_path / "new" / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    seconds = time.perf_counter() - started
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert (
        lines[0].startswith("posprobe: error: could not load GLUE 'rte'") and "no connection to 127.0.0.1" in lines[0]
    )
    assert "--data-dir" in lines[0]
    assert seconds < 15, seconds
    assert not (tmp_path / "new").exists()  # a failed run leaves no empty folder (nor the parents it made)


def test_glue_modules_import_without_torch():
    code = (
        "import sys\nimport posprobe.glue, posprobe.glue.data, posprobe.glue.metrics, posprobe.glue.config\n"
        "import posprobe.glue.report, posprobe.glue.run, posprobe.glue.evaluation, posprobe.glue.runtime\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\nprint(bad)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.stdout.strip() == "[]", proc.stderr[-2000:]


@pytest.mark.integration
@pytest.mark.skipif(not (SHARED_GLUE / "cola" / "train.jsonl").is_file(), reason="shared GLUE data not present")
def test_shared_real_data_loads():
    data = load_glue("cola", SHARED_GLUE.resolve())
    assert len(data["train"]) == 8551 and len(data["validation"]) == 1043
    assert set(data["train"].labels) == {0, 1}


def test_hf_files_win_over_tsv(tmp_path):
    write_jsonl(tmp_path / "rte" / "train.jsonl", [{"sentence1": "a", "sentence2": "b", "label": 1}])
    write_tsv(
        tmp_path / "RTE" / "train.tsv", [["index", "sentence1", "sentence2", "label"], ["0", "x", "y", "entailment"]]
    )
    got = load_split("rte", "train", tmp_path)
    assert got.texts == [("a", "b")] and got.source.endswith("train.jsonl")


# ----------------------------------------------------------------------------------------------------
# damaged data files: one message naming the file, the line and what to fix

_OK = b'{"sentence": "a fine film", "label": 1}\n'
DAMAGED = [
    # (task, relative file, bytes, line named (None: the whole file), words in the message, words in the hint)
    ("sst2", "sst2/train.jsonl", _OK + b'{"sentence": "b", "label": \n', 2, "not valid JSON", "one JSON object"),
    ("sst2", "sst2/train.jsonl", _OK + b'{"sentence": "b"}\n', 2, "missing column(s) 'label'", "sentence, label"),
    ("sst2", "sst2/train.jsonl", b"", None, "the file is empty", "at least one labelled example"),
    ("sst2", "sst2/train.jsonl", _OK * 2 + b'{"sentence": "c", "label": 2}\n', 3, "label 2 is out of range", "0..1"),
    ("sst2", "sst2/train.jsonl", _OK + b'{"sentence": "caf\xe9", "label": 1}\n', 2, "not UTF-8", "UTF-8"),
    ("sst2", "sst2/train.csv", b"sentence,label\nok,1\nbad \xff\xfe,0\n", 3, "not UTF-8", "UTF-8"),
    ("sst2", "sst2/train.csv", b"sentence,idx\nok,1\n", 2, "missing column(s) 'label'", "the HF glue schema"),
    ("sst2", "SST-2/train.tsv", b"sentence\tlabel\nok\t1\nna\xefve\t0\n", 3, "not UTF-8", "UTF-8"),
    ("sst2", "SST-2/train.tsv", b"sentence\tlabel\nok\t1\nno label here\n", 3, "1 tab-separated fields", "2 fields"),
    ("cola", "CoLA/train.tsv", b"", None, "the file is empty", "at least one labelled example"),
    ("mnli", "mnli/train.jsonl", b'{"premise": "a", "hypothesis": "b", "label": 3}\n', 1, "out of range", "0..2"),
    ("stsb", "stsb/train.jsonl", b'{"sentence1": "a", "sentence2": "b", "label": "x"}\n', 1, "not a number", "0-5"),
]


@pytest.mark.parametrize(("task", "name", "content", "line", "words", "hint"), DAMAGED)
def test_damaged_data_files_name_file_line_and_fix(tmp_path, task, name, content, line, words, hint):
    path = tmp_path / name
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(PosprobeError) as err:
        load_split(task, "train", tmp_path)
    message = err.value.message
    assert message.startswith(str(path)), message
    if line is not None:
        assert f"line {line}:" in message, message
    assert words in message and hint in (err.value.hint or ""), err.value.render()
    assert "\n" not in err.value.render()


@pytest.mark.slow  # a fresh posprobe process
def test_cli_reports_non_utf8_data_as_one_line(tmp_path):
    """Was `internal error: UnicodeDecodeError` (exit 1)."""
    write_jsonl(tmp_path / "glue" / "sst2" / "validation.jsonl", [{"sentence": "ok", "label": 1}])
    (tmp_path / "glue" / "sst2" / "train.jsonl").write_bytes(b'{"sentence": "ok", "label": 1}\n{"sentence": "\xe9"}\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "posprobe", "finetune", "--task", "sst2", "--data-dir", str(tmp_path / "glue")]
        + ["--out", str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("posprobe: error:") == 1 and "internal error" not in proc.stderr
    assert "train.jsonl, line 2: bytes that are not UTF-8" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_capped_split_says_how_many_of_how_many(tmp_path):
    """Issue 8 #7: '(subset of 256)' showed the cap, not the file's size."""
    write_jsonl(tmp_path / "sst2" / "train.jsonl", [{"sentence": f"s{i}", "label": i % 2} for i in range(1200)])
    write_jsonl(tmp_path / "sst2" / "validation.jsonl", [{"sentence": "v", "label": 1}] * 3)
    data = load_glue("sst2", tmp_path, max_train_samples=256)
    assert data["train"].describe() == f"sst2 train: 256 of 1,200 examples from {tmp_path / 'sst2' / 'train.jsonl'}"
    assert data["validation"].describe().startswith("sst2 validation: 3 examples from ")
    assert data["train"].subset(10).total == 1200
