"""One run over texts (`posprobe.capture.textrun`) and one save path (`posprobe.formats.save`): the description is
checked once with the same bounds at every entry point, `run_texts` feeds reducers what a hand-made capture
feeds them, and `save` writes a result's stated files as one unit or not at all."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from test_attention import sequences, tiny_model

from posprobe.capture import capture, run_texts, text_run
from posprobe.capture.textrun import DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE, MIN_MAX_LENGTH
from posprobe.errors import ArgumentValueError, PosprobeError
from posprobe.formats.save import OutputFile, Saves, declared_file, record_file, save, text_file
from posprobe.formats.writing import load_npz

PACKAGE = Path(__file__).resolve().parents[1] / "posprobe"


class CountTokens:
    """Counts the counted tokens of every batch, per text id (a reducer of hidden states)."""

    needs = ("hidden_states",)
    rank_sums = ()

    def __init__(self):
        self.per_text = {}

    def add(self, batch) -> None:
        for text_id, counted in zip(batch.text_ids.tolist(), batch.counted.sum(1).tolist()):
            self.per_text[int(text_id)] = int(counted)

    def result(self) -> dict:
        return self.per_text


def test_the_bounds_are_written_once_and_every_entry_point_uses_them():
    """batch_size above MAX_BATCH_SIZE and max_length below the analysis minimum are refused, in one line, by the
    description and by each library entry point before any model is read."""
    from posprobe.pipelines.attention import attention_profiles
    from posprobe.pipelines.rotary import rotary
    from posprobe.pipelines.states import states
    from posprobe.pipelines.weights import profiles

    assert text_run(["a"], batch_size=MAX_BATCH_SIZE).batch_size == MAX_BATCH_SIZE
    for entry in (
        lambda **kw: text_run(["a"], **kw),
        lambda **kw: attention_profiles("no/such/model", ["a"], **kw),
        lambda **kw: states("no/such/model", ["a"], **kw),
        lambda **kw: profiles("no/such/model", texts=["a"], **kw),
        lambda **kw: rotary("no/such/model", texts=["a"], **kw),
    ):
        with pytest.raises(ArgumentValueError, match=f"batch_size must be at most {MAX_BATCH_SIZE}, got"):
            entry(batch_size=MAX_BATCH_SIZE + 1)
        with pytest.raises(ArgumentValueError, match=f"max_length must be at least {MIN_MAX_LENGTH}, got 1"):
            entry(max_length=1)
    assert text_run(input_ids=[[1]], max_length=1, min_length=1).max_length == 1  # a bare capture measures no offset
    with pytest.raises(PosprobeError, match="exactly one of texts and input_ids"):
        text_run(["a"], [[1]])
    with pytest.raises(ArgumentValueError, match="one string"):
        text_run("a text")
    with pytest.raises(ArgumentValueError, match="only with --device auto"):
        text_run(["a"], max_memory="cpu=1GiB")
    assert text_run(["a"], device="auto", max_memory="cpu=1GiB,0=2GiB").max_memory == {"cpu": 2**30, 0: 2 * 2**30}


def test_the_cli_shows_the_library_default_batch_size():
    from posprobe.cli import options

    assert options.DEFAULT_BATCH_SIZE == DEFAULT_BATCH_SIZE


def test_the_run_options_are_defined_once():
    """Each run-over-texts option (`--max-length`, `--batch-size`, `--device`, ...) is declared in cli/options.py
    and nowhere else among the commands that run a model over texts through `run_texts`."""
    shared = ('"--text"', '"--column"', '"--max-texts"', '"--device"', '"--max-memory"')
    for path in (PACKAGE / "cli").glob("*.py"):
        if path.name in ("options.py", "report.py", "learned.py", "context.py", "finetune.py", "ablate.py"):
            continue  # report / learned / context / finetune / ablate: their --text and --batch-size mean other things
        text = path.read_text(encoding="utf-8")
        assert not [flag for flag in shared if flag in text], path.name


def test_run_texts_feeds_the_reducers_what_a_hand_made_capture_feeds_them():
    model = tiny_model("bert")
    ids = sequences(7)
    calls = []
    run = text_run(input_ids=ids, max_length=9, batch_size=3, device="cpu")
    output = run_texts(model, run, lambda loaded: calls.append(loaded) or [CountTokens()], check=lambda net: "seen")
    by_hand = CountTokens()
    capture(model, [by_hand], input_ids=ids, max_length=9, batch_size=3)
    assert output.reducers[0].result() == by_hand.result()
    assert output.reducers[0].result() == {i: min(len(s), 9) for i, s in enumerate(ids)}  # brute force
    assert output.summary.n_texts == len(ids) and output.model.max_length == 9
    assert [loaded.checked for loaded in calls] == ["seen"] and str(output.model.device) == "cpu"


class Toy(Saves):
    """A result that states three files: arrays, a record naming the arrays' path, a text."""

    def __init__(self, fail: bool = False):
        self.fail = fail

    def output_files(self, fmt: str, suffix: str = "") -> list[OutputFile]:
        def text() -> str:
            if self.fail:
                raise RuntimeError("drawing failed")
            return f"figure as {fmt}"

        return [
            declared_file("toy.npz", {"what": "toy"}, {"x": np.arange(3.0)}, {"x": ("item",)}),
            record_file("toy.json", lambda saved: {"npz": str(saved["npz"]), "suffix": suffix}),
            text_file(f"toy{suffix}.{fmt}", text, "figures"),
        ]


def test_save_writes_every_stated_file_with_the_record_beside(tmp_path):
    saved = Toy().save(tmp_path / "out", "svg", suffix="_a")
    assert list(saved.paths) == ["toy.npz", "toy.json", "toy_a.svg"]
    assert saved["npz"] == tmp_path / "out" / "toy.npz" and saved["figures"] == [tmp_path / "out" / "toy_a.svg"]
    metadata, arrays = load_npz(saved["npz"])
    assert metadata == {"what": "toy", "dims": {"x": ["item"]}} and arrays["x"].tolist() == [0.0, 1.0, 2.0]
    assert json.loads(saved["json"].read_text()) == saved.record == {"npz": str(saved["npz"]), "suffix": "_a"}
    assert saved["figures"][0].read_text() == "figure as svg"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["toy.json", "toy.npz", "toy_a.svg"]
    assert save(Toy(), tmp_path / "again", "png").paths["toy.png"].exists()  # the library and the CLI: one function


def test_save_leaves_nothing_when_a_file_fails_or_the_format_is_unknown(tmp_path):
    with pytest.raises(RuntimeError, match="drawing failed"):
        Toy(fail=True).save(tmp_path / "new" / "out")
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(RuntimeError):
        Toy(fail=True).save(existing)
    assert list(existing.iterdir()) == []
    with pytest.raises(PosprobeError, match="unknown figure format 'gif'"):
        Toy().save(tmp_path / "x", "gif")
    assert not (tmp_path / "x").exists()


def test_results_are_written_only_through_the_save_path():
    """No command or pipeline assembles its own file dict: `write_files` / `write_npz` / `save_figure` are called
    only in formats/ (and by the report and glue runs, which write their own run records)."""
    writers = {"write_files", "write_npz", "save_npz", "save_figure", "figure_writer", "json_writer"}
    for folder in ("cli", "pipelines"):
        for path in (PACKAGE / folder).glob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            called = {
                node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                for node in ast.walk(tree)
                if isinstance(node, ast.Call)
            }
            assert not called & writers, f"{path.name} writes {sorted(called & writers)} itself"


def test_a_library_result_saves_exactly_what_the_command_writes(tiny_checkpoints, tmp_path):
    """`posprobe profiles` and `profiles(...).save(...)`: the same file names, the same arrays and metadata."""
    from typer.testing import CliRunner

    from posprobe.cli import app
    from posprobe.pipelines.weights import profiles

    folder = str(tiny_checkpoints["bert"])
    done = CliRunner().invoke(app, ["profiles", folder, "--layers", "0", "--out", str(tmp_path / "cli"), "--json"])
    assert done.exit_code == 0, done.output
    saved = profiles(folder, [0]).save(tmp_path / "lib")
    assert (
        sorted(p.name for p in (tmp_path / "cli").iterdir())
        == sorted(saved.paths)
        == [
            "profiles_layer0_paper.png",
            "profiles_paper.npz",
        ]
    )
    (cli_meta, cli_arrays), (lib_meta, lib_arrays) = (
        load_npz(tmp_path / "cli" / "profiles_paper.npz"),
        load_npz(saved["npz"]),
    )
    assert cli_meta.keys() == lib_meta.keys() and cli_arrays.keys() == lib_arrays.keys()
    for name in cli_arrays:
        np.testing.assert_array_equal(cli_arrays[name], lib_arrays[name])


def test_a_finished_command_leaves_library_saves_cleaning_up_after_themselves(tiny_checkpoints, tmp_path):
    """A successful CLI run in this process (notebook, test session) ends its run log: a library save that fails
    afterwards still removes the folders it created."""
    from posprobe.cli import main

    main(["toeplitz", str(tiny_checkpoints["bert"]), "--out", str(tmp_path / "cli")])
    with pytest.raises(RuntimeError, match="drawing failed"):
        Toy(fail=True).save(tmp_path / "new" / "out")
    assert not (tmp_path / "new").exists()
