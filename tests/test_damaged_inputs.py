"""Damaged and hostile checkpoints through the command line: exit 2 and one `posprobe: error:` line, never an
`internal error`, nothing written, and no code from the checkpoint ever run.

Each case copies a tiny saved BERT (or RoBERTa) and breaks one thing, as real downloads, disks and hostile
files do. Every case runs through `posprobe toeplitz`, `fhat` and `retrofit`.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from posprobe.cli import main
from posprobe.errors import ArgumentTypeError, PosprobeError

MARKER = "PAYLOAD_RAN"


class _Payload:
    """Unpickling this calls exec, which would write a marker file: a loader that runs pickled code fails."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return exec, (f"open({self.target!r}, 'w').write('x')",)


# -- helpers that break one thing in a copied checkpoint ------------------------------------------------------
def _header(folder: Path):
    data = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _write_header(folder: Path, header, payload: bytes) -> None:
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + payload)


def _edit_entry(key_part: str, **changes):
    def edit(folder: Path):
        header, payload = _header(folder)
        name = next(n for n in header if key_part in n)
        for field, value in changes.items():
            header[name][field] = value(header[name][field]) if callable(value) else value
        _write_header(folder, header, payload)

    return edit


def _edit_config(**changes):
    def edit(folder: Path):
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))

    return edit


def _truncate(folder: Path):
    file = folder / "model.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _zero_bytes(folder: Path):
    (folder / "model.safetensors").write_bytes(b"")


def _array_header(folder: Path):
    _write_header(folder, [1, 2, 3], b"")


def _overlap(folder: Path):
    header, payload = _header(folder)
    names = sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])
    first, second = header[names[0]], header[names[1]]
    size = second["data_offsets"][1] - second["data_offsets"][0]
    second["data_offsets"] = [first["data_offsets"][0], first["data_offsets"][0] + size]
    _write_header(folder, header, payload)


def _set_tensor(key_part: str, transform):
    """Rewrite the model with transformers' own writer after changing one tensor (stays a valid file)."""

    def edit(folder: Path):
        from safetensors.numpy import load_file, save_file

        tensors = load_file(folder / "model.safetensors")
        name = next(n for n in tensors if key_part in n)
        tensors[name] = transform(tensors[name])
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})

    return edit


def _not_json(folder: Path):
    (folder / "config.json").write_text("{'model_type': bert")


def _missing_shard(folder: Path):
    header, _ = _header(folder)
    index = {"metadata": {}, "weight_map": {n: "model-00002-of-00002.safetensors" for n in header if n[0] != "_"}}
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _pickle_only(folder: Path):
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def _hostile_pickle(folder: Path):
    import torch

    (folder / "model.safetensors").unlink()
    torch.save(
        {"embeddings.position_embeddings.weight": _Payload(str(folder.parent / MARKER))}, folder / "pytorch_model.bin"
    )


# (id, family, break, extra flags)
CASES = [
    ("truncated-file", "bert", _truncate, []),
    ("zero-byte-file", "bert", _zero_bytes, []),
    ("header-json-array", "bert", _array_header, []),
    ("negative-shape", "bert", _edit_entry("position_embeddings", shape=lambda s: [-s[0], s[1]]), []),
    ("negative-offset", "bert", _edit_entry("position_embeddings", data_offsets=lambda o: [o[0] - 64, o[1] - 64]), []),
    ("overlapping-offsets", "bert", _overlap, []),
    ("unknown-dtype", "bert", _edit_entry("position_embeddings", dtype="F33"), []),
    ("nan-in-position-table", "bert", _set_tensor("position_embeddings", lambda t: t * np.float32("nan")), []),
    ("inf-in-position-table", "bert", _set_tensor("position_embeddings", lambda t: t + np.float32("inf")), []),
    ("position-table-0-rows", "bert", _set_tensor("position_embeddings", lambda t: t[:0]), []),
    ("position-table-1-row", "bert", _set_tensor("position_embeddings", lambda t: t[:1]), []),
    ("config-not-json", "bert", _not_json, []),
    ("config-array", "bert", lambda f: (f / "config.json").write_text("[1, 2]"), []),
    ("config-wrong-types", "bert", _edit_config(hidden_size="32", num_attention_heads=4.0), []),
    ("config-heads-do-not-divide", "bert", _edit_config(num_attention_heads=5), []),
    ("pad-token-id-null-roberta", "roberta", _edit_config(pad_token_id=None), []),
    ("negative-max-positions", "bert", _edit_config(max_position_embeddings=-1), []),
    ("zero-layers", "bert", _edit_config(num_hidden_layers=0), []),
    ("layer-norm-eps-string", "bert", _edit_config(layer_norm_eps="1e-12"), []),
    ("unknown-model-type", "bert", _edit_config(model_type="zzz-unknown"), []),
    ("model-type-not-a-string", "bert", _edit_config(model_type=7), []),
    ("index-names-missing-shard", "bert", _missing_shard, []),
    ("pickle-only-without-allow-pickle", "bert", _pickle_only, []),
    ("hostile-pickle-with-allow-pickle", "bert", _hostile_pickle, ["--allow-pickle"]),
]
COMMANDS = {
    "toeplitz": ["toeplitz"],
    "fhat": ["fhat"],
    "retrofit": ["retrofit", "--mechanism", "tisa"],
}


def _model(name: str, family: str, broken, tiny_checkpoints, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(tiny_checkpoints[family], folder)
    broken(folder)
    return folder


# every case through toeplitz in the default run; through fhat and retrofit too in the slow tier (CI)
@pytest.mark.parametrize(
    "command", [c if c == "toeplitz" else pytest.param(c, marks=pytest.mark.slow) for c in COMMANDS]
)
@pytest.mark.parametrize("name, family, broken, flags", CASES, ids=[c[0] for c in CASES])
def test_damaged_input_is_one_clean_line(name, family, broken, flags, command, tiny_checkpoints, tmp_path, capfd):
    folder = _model(name, family, broken, tiny_checkpoints, tmp_path)
    out = tmp_path / "out"
    capfd.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*COMMANDS[command][:1], str(folder), *COMMANDS[command][1:], "--out", str(out), *flags])
    captured = capfd.readouterr()
    lines = captured.err.strip().splitlines()
    assert exit_info.value.code == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith("posprobe: error:"), captured.err
    assert "internal error" not in lines[0] and "Traceback" not in captured.err
    assert captured.out == ""
    # nothing half-written (an empty --out folder left by toeplitz/fhat is the hardening issue's, #8)
    assert not out.exists() or not any(out.rglob("*")), "a refused run wrote output"
    assert not (tmp_path / MARKER).exists(), "code from the checkpoint ran"


@pytest.mark.slow
def test_hostile_pickle_never_runs_through_the_installed_cli(tiny_checkpoints, tmp_path):
    """The real entry point, with transformers' logging at its default level: one line, no payload."""
    folder = _model("evil", "bert", _hostile_pickle, tiny_checkpoints, tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_VERBOSITY"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "posprobe",
            "retrofit",
            str(folder),
            "-m",
            "tisa",
            "--allow-pickle",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posprobe: error:") and "internal error" not in lines[0], proc.stderr
    assert not (tmp_path / MARKER).exists()
    assert not (tmp_path / "o").exists()


# -- the library entry point -------------------------------------------------------------------------------------
def test_load_model_refuses_nan_anywhere(tiny_checkpoints, tmp_path):
    """NaN in a tensor the analyses never read: load_model (retrofit, finetune, evaluate) still refuses."""
    from posprobe.retrofitting.loading import load_model

    folder = _model(
        "nan", "bert", _set_tensor("layer.1.output.dense.weight", lambda t: t * np.nan), tiny_checkpoints, tmp_path
    )
    with pytest.raises(PosprobeError, match="NaN or infinite"):
        load_model(folder)


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")])
def test_finite_check_by_sums_refuses_exactly_the_non_finite(bad):
    """`check_finite` reads a finite sum as every entry finite: one NaN or infinity among finite values is refused;
    entries whose float32 sum overflows (3e38 + 3e38) but that are all finite are accepted (checked entry by
    entry)."""
    import torch

    from posprobe.checkpoint.loading import check_finite

    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        model.weight[0, :2] = 3e38  # finite, its sum is not
        if bad is not None:
            model.weight[2, 3] = bad
    assert not bool(torch.isfinite(model.weight.sum()))
    if bad is None:
        check_finite(model, "m")
    else:
        with pytest.raises(PosprobeError, match="tensor 'weight' of 'm' contains NaN or infinite values"):
            check_finite(model, "m")


@pytest.mark.parametrize("value", [123, 1.5, ["a"], b"bert"])
def test_load_model_argument_type(value):
    from posprobe.retrofitting.loading import load_model

    with pytest.raises(ArgumentTypeError, match="path_or_id must be a hub id or a folder path"):
        load_model(value)


def test_load_model_accepts_pathlike_and_refuses_remote_code(tiny_checkpoints):
    from posprobe.retrofitting.loading import load_model

    assert load_model(tiny_checkpoints["bert"]).config.model_type == "bert"
    with pytest.raises(PosprobeError, match="never runs code"):
        load_model(tiny_checkpoints["bert"], trust_remote_code=True)
    with pytest.raises(PosprobeError, match="returns the model only"):
        load_model(tiny_checkpoints["bert"], output_loading_info=True)
    with pytest.raises(ArgumentTypeError, match="verbose must be True or False"):
        load_model(tiny_checkpoints["bert"], verbose="yes")
    assert load_model(tiny_checkpoints["bert"], verbose=True).config.model_type == "bert"


def test_load_model_is_quiet_and_restores_logging(tiny_checkpoints, tmp_path, capfd):
    """A retrofitted checkpoint makes transformers report unknown tensors; by default nothing is printed."""
    from transformers.utils import logging as hf_logging

    from posprobe.retrofitting.install import retrofit, save_retrofitted
    from posprobe.retrofitting.loading import load_model

    save_retrofitted(retrofit(load_model(tiny_checkpoints["bert"]), "tisa", init="random"), tmp_path / "r")
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_info()
    try:
        capfd.readouterr()
        load_model(tmp_path / "r")
        captured = capfd.readouterr()
        assert captured.out == "" and captured.err == ""
        assert hf_logging.get_verbosity() == hf_logging.INFO
    finally:
        hf_logging.set_verbosity(previous)


def test_hub_id_offline_fails_at_once(monkeypatch):
    import time

    from posprobe.retrofitting.loading import load_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(PosprobeError, match="not in the local hub cache|cannot reach the model hub"):
        load_model("no-such-org/no-such-model-xyz")
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(
    "typed, meant",
    [
        ("SmolLM2-135M", "SmolLM2-135M-Instruct"),
        ("smollm2-135m-instruct", "SmolLM2-135M-Instruct"),
        ("all-minilm-l6-v2", "all-MiniLM-L6-v2"),
        ("MiniLM", "all-MiniLM-L6-v2"),  # issue 49: the packaged default's family name
        ("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"),  # its hub id, not in the cache
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
        ("bert-base-uncased", None),
        ("microsoft/MiniLM-L12-H384-uncased", None),  # another MiniLM: no packaged name is it
    ],
)
def test_a_mistyped_packaged_name_offline_names_the_packaged_model(typed, meant, monkeypatch):
    """A packaged name in another case or cut short is not a hub id to fetch: the offline error asks whether the
    packaged model was meant (and says nothing of the kind for an unrelated hub id)."""
    from posprobe.checkpoint.resolve import packaged_suggestion
    from posprobe.retrofitting.loading import load_model

    assert packaged_suggestion(typed) == meant
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PosprobeError) as info:
        load_model(typed)
    assert (f"did you mean the packaged model '{meant}'" in str(info.value)) == (meant is not None), str(info.value)


def test_params_reads_config_only(tiny_checkpoints, tmp_path, capfd):
    """`params` needs no weights (issue 8 #7)."""
    folder = tmp_path / "cfg-only"
    folder.mkdir()
    shutil.copy(tiny_checkpoints["bert"] / "config.json", folder / "config.json")
    capfd.readouterr()
    main(["params", str(folder), "--json"])  # returns normally on success
    assert json.loads(capfd.readouterr().out)["n_heads"] == 4


def test_bert_with_pad_token_id_null_is_analysed(tiny_checkpoints, tmp_path):
    """Issue 8: `pad_token_id: null` crashed architectures.py; BERT does not use it for positions."""
    from posprobe.pipelines.weights import toeplitz as toeplitz_analysis

    folder = _model("padnull", "bert", _edit_config(pad_token_id=None), tiny_checkpoints, tmp_path)
    assert toeplitz_analysis(str(folder)).matrix.shape[0] == 64


@pytest.mark.parametrize(
    "family", ["bert", "roberta", "xlm-roberta", "camembert", "albert", "electra", "distilbert", "gpt2"]
)
def test_default_configs_of_checked_families_pass(family):
    """The config checks must not refuse what transformers itself writes (e.g. GPT-2's `n_inner: null`)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from posprobe.architectures.config import validate_config

    config = json.loads(CONFIG_MAPPING[family]().to_json_string())
    assert validate_config(config, family) is config


def test_other_families_keep_their_own_conventions():
    """Lists of per-stage heads or -1 pad ids belong to other families: only transformers judges them."""
    from posprobe.architectures.config import validate_config

    validate_config({"model_type": "segformer", "num_attention_heads": [1, 2, 5, 8]}, "x")
    validate_config({"model_type": "llama", "pad_token_id": -1, "eos_token_id": [1, 2]}, "x")
    with pytest.raises(PosprobeError, match="expected a string"):
        validate_config({"model_type": "llama", "_name_or_path": 3}, "x")


def test_resolve_model_argument_type_and_config_only(tiny_checkpoints, tmp_path):
    from posprobe.checkpoint import resolve_model

    with pytest.raises(ArgumentTypeError, match="model must be a hub id or a folder path"):
        resolve_model(123)
    assert resolve_model(tiny_checkpoints["bert"]).weight_format == "safetensors"  # a Path is fine
    shutil.copy(tiny_checkpoints["bert"] / "config.json", tmp_path / "config.json")
    with pytest.raises(PosprobeError, match="holds no model weights"):
        resolve_model(tmp_path)
    assert resolve_model(tmp_path, require_weights=False).weight_format == "none"


def test_index_must_match_the_shards(tiny_checkpoints, tmp_path):
    """An index naming a shard that does not hold the tensor, and a tensor stored in two shards."""
    from posprobe.checkpoint import WeightReader

    folder = _model("idx", "bert", lambda f: None, tiny_checkpoints, tmp_path)
    header, _ = _header(folder)
    names = [n for n in header if n != "__metadata__"]
    (folder / "model.safetensors").rename(folder / "a.safetensors")
    weight_map = {names[0]: "a.safetensors", names[1]: "b.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(folder / "a.safetensors", folder / "b.safetensors")
    with pytest.raises(PosprobeError, match="stored twice"):
        WeightReader(folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {names[0]: "../a.safetensors"}}))
    with pytest.raises(PosprobeError, match="bad weight_map"):
        WeightReader(folder)
    (folder / "b.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {names[0]: "a.safetensors", "missing.tensor": "a.safetensors"}})
    )
    with pytest.raises(PosprobeError, match="does not hold it"):
        WeightReader(folder)


def _profiles_file(tiny_checkpoints, tmp_path: Path) -> Path:
    main(["profiles", str(tiny_checkpoints["bert"]), "--layers", "0", "--out", str(tmp_path / "p"), "--json"])
    return next((tmp_path / "p").glob("*.npz"))


def _truncated_zip(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _metadata_list(path: Path) -> None:
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files if k != "metadata"}
    with open(path, "wb") as fh:
        np.savez(fh, metadata=np.array(json.dumps([1, 2, 3])), **arrays)


def _not_a_zip(path: Path) -> None:
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 64)


@pytest.mark.parametrize("damage", [_truncated_zip, _metadata_list, _not_a_zip])
def test_a_damaged_profiles_file_is_one_clean_line(damage, tiny_checkpoints, tmp_path, capfd):
    """A .npz cut short by a copy, or written by something else, given to fit-tisa: one line, exit 2."""
    npz = _profiles_file(tiny_checkpoints, tmp_path)
    damage(npz)
    capfd.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit-tisa", str(npz), "--kernels", "1", "--out", str(tmp_path / "fit")])
    captured = capfd.readouterr()
    lines = captured.err.strip().splitlines()
    assert exit_info.value.code == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith("posprobe: error:") and "internal error" not in lines[0]
    assert not (tmp_path / "fit").exists()
