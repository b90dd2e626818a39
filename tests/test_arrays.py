"""Declared arrays (`formats.arrays`): the one `.npz` writer refuses, before anything is written, an array that is
not declared, a declared one that is missing, a wrong number of dimensions and two sizes for one dimension name;
every result's `.npz` carries dimension names that match its arrays (checked here by reading the file back with
numpy alone), and no module but `formats.arrays` writes a `.npz`."""

from __future__ import annotations

import ast
import json
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from test_attention import tiny_model
from test_context import tiny_llama

import posprobe
from posprobe.formats.arrays import ArrayDeclarationError, check_arrays, either, load_named, optional
from posprobe.formats.save import Saves, arrays_file

PACKAGE = Path(posprobe.__file__).parent


@dataclass(frozen=True)
class Toy(Saves):
    arrays_given: dict

    ARRAYS = {
        "loss": ("variant", "position"),
        "variants": ("variant",),
        "controls": optional("variant", "draw"),
        "reference": either(("layer",), ("layer", "head"), optional=True),
        "*_correlation": ("layer", "head"),
    }

    def metadata(self) -> dict:
        return {"model": "toy"}

    def arrays(self) -> dict:
        return self.arrays_given

    def output_files(self, fmt: str) -> list:
        return [arrays_file("toy.npz", self)]


GOOD = {"loss": np.zeros((2, 5)), "variants": np.array(["none", "yarn:4"])}


def read_npz(path: Path) -> tuple[dict, dict]:
    """The metadata and arrays of a `.npz`, read with numpy and json alone (not posprobe's reader)."""
    with np.load(path, allow_pickle=False) as data:
        return json.loads(str(data["metadata"])), {k: data[k] for k in data.files if k != "metadata"}


def test_the_writer_stores_the_declared_dimension_names(tmp_path):
    arrays = GOOD | {"reference": np.ones((3, 4)), "fhat_correlation": np.ones((3, 4)), "controls": np.ones((2, 7))}
    saved = Toy(arrays).save(tmp_path / "out")
    metadata, stored = read_npz(saved["npz"])
    assert metadata == {
        "model": "toy",
        "dims": {
            "loss": ["variant", "position"],
            "variants": ["variant"],
            "reference": ["layer", "head"],  # the alternative with two dimensions
            "fhat_correlation": ["layer", "head"],  # by the pattern
            "controls": ["variant", "draw"],
        },
    }
    for name, value in arrays.items():  # the numbers as handed over, byte for byte
        assert stored[name].dtype == value.dtype and stored[name].tobytes() == value.tobytes()
    _, named = load_named(saved["npz"])
    assert named["loss"][0] == ("variant", "position") and named["loss"][1].shape == (2, 5)
    # the other alternative, chosen by the number of dimensions
    assert check_arrays(GOOD | {"reference": np.ones(3)}, Toy.ARRAYS, "toy.npz")["reference"] == ("layer",)


@pytest.mark.parametrize(
    "arrays, message",
    [
        (GOOD | {"new_thing": np.ones(3)}, "toy.npz: array 'new_thing' is not declared"),
        ({"loss": np.zeros((2, 5))}, r"toy.npz: declared array\(s\) variants not handed over"),
        (GOOD | {"loss": np.zeros(5)}, r"toy.npz: array 'loss' has shape \(5,\), declared \('variant', 'position'\)"),
        (GOOD | {"variants": np.array(["a", "b", "c"])}, "dimension 'variant' is 3 in 'variants' .* but 2 in 'loss'"),
        (GOOD | {"controls": np.ones((3, 7))}, "dimension 'variant' is 3 in 'controls'"),
        (GOOD | {"reference": np.ones((3, 4, 5))}, r"declared \('layer',\) or \('layer', 'head'\)"),
        (GOOD | {"reference": np.ones(3), "x_correlation": np.ones((4, 4))}, "dimension 'layer' is 4"),
    ],
)
def test_a_wrong_or_undeclared_array_fails_at_write_time_and_nothing_is_written(tmp_path, arrays, message):
    with pytest.raises(ArrayDeclarationError, match=message):
        Toy(arrays).save(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_alternatives_must_differ_in_their_number_of_dimensions():
    with pytest.raises(ArrayDeclarationError, match="must differ"):
        either(("layer",), ("head",))


def test_a_file_without_dims_reads_with_numbered_dims(tmp_path):
    path = tmp_path / "old.npz"
    np.savez(path, metadata=np.array(json.dumps({"model": "old"})), x=np.ones((2, 3)))
    assert load_named(path)[1]["x"][0] == ("dim_0", "dim_1")


def test_only_the_declared_writer_writes_a_npz():
    """`write_npz` (and `np.savez`) are called in `formats/arrays.py` alone (`writing.save_npz`, the raw writer the
    tests use to make foreign files, is not called by posprobe)."""
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        called = {
            node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
        }
        rel = path.relative_to(PACKAGE).as_posix()
        allowed = {"formats/arrays.py": {"write_npz"}, "formats/writing.py": {"write_npz", "savez"}}.get(rel, set())
        assert not (called & {"write_npz", "save_npz", "savez", "savez_compressed"}) - allowed, rel


# -- every result's .npz --------------------------------------------------------------------------------------------


def check_dims(path: Path) -> dict:
    """Every array of the file has a dims entry of its ndim, and each dimension name one size throughout."""
    metadata, arrays = read_npz(path)
    dims = metadata["dims"]
    assert sorted(dims) == sorted(arrays), path.name
    sizes: dict[str, set] = {}
    for name, a in arrays.items():
        assert len(dims[name]) == a.ndim, (path.name, name, dims[name], a.shape)
        for dim, size in zip(dims[name], a.shape):
            sizes.setdefault(dim, set()).add(size)
    assert all(len(s) == 1 for s in sizes.values()), (path.name, sizes)
    return dims


@pytest.fixture(scope="module")
def ids():
    rng = np.random.default_rng(0)
    return [list(rng.integers(5, 99, size=n)) for n in (12, 9, 14, 7, 12, 10)]


@pytest.mark.slow
def test_every_text_result_npz_carries_its_dims(tmp_path, ids):
    bert = tiny_model("bert")
    saved = posprobe.attention_profiles(bert, input_ids=ids, special_ids=[0]).save(tmp_path / "attention")
    assert check_dims(saved["npz"])["mean_distance"] == ["layer", "head"]
    saved = posprobe.states(bert, input_ids=ids, min_texts=2).save(tmp_path / "states")
    assert check_dims(saved["npz"])["positional_vectors"] == ["state", "position", "channel"]
    saved = posprobe.profiles(bert, [0, 1]).save(tmp_path / "profiles")
    assert check_dims(saved["npz"])["profiles"] == ["layer", "head", "offset"]


def test_every_causal_result_npz_carries_its_dims(tmp_path, ids):
    llama = tiny_llama()
    saved = posprobe.rotary(llama).save(tmp_path / "rotary")
    assert check_dims(saved["npz"])["k_band_norm"] == ["layer", "kv_head", "band"]
    result = posprobe.context(llama, [8, 16], documents=ids, windows=2, bos_id=2, rope_scaling=["none", "linear:2"])
    assert check_dims(result.save(tmp_path / "context")["npz"])["position_loss"] == ["variant", "position"]


def test_the_needle_npz_carries_its_dims(tmp_path):
    from test_needle import HAYSTACK, TASK, planted_llama

    model, tokenizer = planted_llama()
    grid = posprobe.NeedleGrid(lengths=(150,), depths=(0.0, 1.0), trials=1)
    result = posprobe.needle(model, tokenizer=tokenizer, haystack=HAYSTACK, grid=grid, task=TASK)
    dims = check_dims(result.save(tmp_path / "needle")["npz"])
    assert dims["needle_attention"] == ["length", "depth", "trial", "layer", "head"]


@pytest.mark.slow
def test_the_series_and_learned_npz_carry_their_dims(tmp_path, tiny_checkpoints, ids):
    from typer.testing import CliRunner

    from posprobe.cli import app

    run = tmp_path / "run"
    for step in (1, 2):
        shutil.copytree(tiny_checkpoints["bert"], run / f"checkpoint-{step}")
    saved = posprobe.states_series(str(run), input_ids=ids, min_texts=2).save(tmp_path / "series")
    assert check_dims(saved["npz"])["probe_r2"] == ["checkpoint", "state"]
    assert all(check_dims(p)["layers"] == ["state"] for p in saved["checkpoint_npz"])

    done = CliRunner().invoke(app, ["retrofit", str(tiny_checkpoints["bert"]), "-m", "tisa", "--out", str(run / "t")])
    assert done.exit_code == 0, done.output
    done = CliRunner().invoke(app, ["learned", str(run / "t"), "--out", str(tmp_path / "learned"), "--json"])
    assert done.exit_code == 0, done.output
    dims = check_dims(Path(json.loads(done.stdout)["npz"]))
    assert dims["functions"] == dims["initial"] == ["layer", "head", "offset"]


def test_npz_members_hold_plain_arrays(tmp_path):
    """The dims live in the JSON metadata entry: the members are the arrays and `metadata` (no extra member)."""
    saved = Toy(GOOD).save(tmp_path / "out")
    with zipfile.ZipFile(saved["npz"]) as z:
        assert sorted(z.namelist()) == ["loss.npy", "metadata.npy", "variants.npy"]
