"""The weights path of a rotary model imports neither torch nor transformers (issue 49): `profiles`, `fhat` and `rotary`
on a tiny Llama folder read the config and the safetensors files, compute the original RoPE in numpy and decide per-type
rotary settings from the family table, in a fresh process whose `sys.modules` is checked at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import json, sys
from posprobe.cli import main
try:
    main(sys.argv[1:])
except SystemExit as stop:
    assert not stop.code, stop.code
print("IMPORTED " + json.dumps(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers"})))
"""


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    folder = tmp_path_factory.mktemp("llama")
    LlamaModel(config).save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(
    "command", [["profiles", "--layers", "all"], ["fhat", "--layer", "1"], ["rotary", "--layers", "all"]]
)
def test_rotary_weights_commands_import_neither_torch_nor_transformers(command, llama_folder, tmp_path):
    args = [command[0], str(llama_folder), *command[1:], "--positions", "32", "--json", "--out", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("IMPORTED "))
    assert json.loads(line[len("IMPORTED ") :]) == []


@pytest.mark.slow  # a fresh process, as the test above
def test_rotary_budget_without_transformers_is_the_modules(llama_folder, tmp_path):
    """The budget read from config.json alone (issue 49) equals the one from Llama's own rotary module: its
    wavelengths are 2 pi / the module's inv_freq, and the trained length is max_position_embeddings."""
    import numpy as np
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    args = ["rotary", str(llama_folder), "--positions", "32", "--json", "--out", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    budget = json.loads(done.stdout.splitlines()[0])["budget"]
    inv_freq = LlamaRotaryEmbedding(LlamaConfig.from_pretrained(llama_folder)).inv_freq.double().numpy()
    (variant,) = budget["variants"]
    assert variant["variant"] == "none"
    np.testing.assert_array_equal(variant["wavelengths"], 2 * np.pi / inv_freq)
    assert budget["trained_length"] == 64 and budget["rope_theta"] == 10000.0 and budget["rotated_dims"] == 8
