"""`posprobe retrofit` through typer's runner (JSON contract) and through `main` (errors -> one line, exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from posprobe.cli import app, main
from posprobe.retrofitting.install import added_parameters
from posprobe.retrofitting.loading import load_model

runner = CliRunner()


def run_main(args, capsys):
    """(exit code, captured output) of `main(args)`; 0 when it returns normally."""
    try:
        main(args)
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code or 0
    return code, capsys.readouterr()


def test_retrofit_json_and_round_trip(tiny_checkpoints, tmp_path):
    out = tmp_path / "fixed"
    result = runner.invoke(
        app,
        [
            "retrofit",
            str(tiny_checkpoints["bert"]),
            "--mechanism",
            "fixed",
            "--radius",
            "3",
            "--init",
            "random",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["mechanism"] == "fixed" and record["out"] == str(out)
    assert record["added_parameters"] == 2 * 4 * 7  # L * H * (2r+1)
    assert json.loads((out / "config.json").read_text())["posprobe"]["mechanism"] == "fixed"
    model = load_model(out).eval()
    assert added_parameters(model) == record["added_parameters"]
    ids = torch.randint(5, 99, (2, 6))
    plain = load_model(tiny_checkpoints["bert"]).eval()
    with torch.no_grad():
        assert not torch.allclose(model(ids)[0], plain(ids)[0])  # random init changes the model
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_retrofit_tisa_replace_human_output(tiny_checkpoints, tmp_path):
    out = tmp_path / "tisa"
    result = runner.invoke(
        app,
        [
            "retrofit",
            str(tiny_checkpoints["albert"]),
            "-m",
            "tisa",
            "--kernels",
            "2",
            "--drop-position-embeddings",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "tisa" in result.output and "48 added" in result.output  # 3 * S * H * L = 3 * 2 * 4 * 2
    assert json.loads((out / "config.json").read_text())["posprobe"]["drop_position_embeddings"] is True


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mechanism", "nope"], "unknown --mechanism 'nope'"),
        (["--mechanism", "fixed", "--init", "fit:/no/such/file"], "only applies to TISA"),
        (["--mechanism", "tisa", "--init", "fit:/no/such/file"], "does not exist"),
        (["--mechanism", "tisa", "--radius", "0"], "--radius"),
    ],
)
def test_retrofit_errors_leave_nothing(tiny_checkpoints, tmp_path, capsys, args, message):
    out = tmp_path / "out"
    code, captured = run_main(["retrofit", str(tiny_checkpoints["bert"]), "--out", str(out), *args], capsys)
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posprobe: error:") and message in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_retrofit_unsupported_architecture(tiny_checkpoints, tmp_path, capsys):
    code, captured = run_main(
        ["retrofit", str(tiny_checkpoints["gpt2"]), "-m", "tisa", "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and "cannot retrofit a 'gpt2' model" in captured.err
    assert not (tmp_path / "o").exists()


def test_retrofit_refuses_existing_output(tiny_checkpoints, tmp_path, capsys):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("x")
    code, captured = run_main(
        ["retrofit", str(tiny_checkpoints["bert"]), "-m", "tisa", "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and "already exists" in captured.err
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["keep.txt"]


def test_retrofit_of_a_retrofitted_model_is_refused(tiny_checkpoints, tmp_path, capsys):
    first = tmp_path / "a"
    assert (
        runner.invoke(app, ["retrofit", str(tiny_checkpoints["bert"]), "-m", "fixed", "--out", str(first)]).exit_code
        == 0
    )
    code, captured = run_main(["retrofit", str(first), "-m", "tisa", "--out", str(tmp_path / "b")], capsys)
    assert code == 2 and "already retrofitted" in captured.err


def test_cli_import_stays_light():
    code = "import sys, posprobe.cli.retrofit; print(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_retrofit_keeps_the_task_head(tmp_path):
    """A fine-tuned classifier keeps its head: the saved class comes from config.json `architectures`."""
    import transformers as tf
    from conftest import TINY

    torch.manual_seed(0)
    classifier = tf.BertForSequenceClassification(tf.BertConfig(**TINY, num_labels=3)).eval()
    classifier.save_pretrained(tmp_path / "clf")
    result = CliRunner().invoke(
        app, ["retrofit", str(tmp_path / "clf"), "-m", "composite", "--out", str(tmp_path / "out"), "--json"]
    )
    assert result.exit_code == 0, result.output
    again = load_model(tmp_path / "out", tf.AutoModelForSequenceClassification).eval()
    ids = torch.randint(0, 99, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids).logits, classifier(input_ids=ids).logits)


def _kernels(path, s, layers=2, heads=4):
    import numpy as np
    from safetensors.numpy import save_file

    shape = (layers, heads, s)
    arrays = {k: np.ones(shape, np.float32) for k in "abc"}
    save_file(arrays, str(path), metadata={"posprobe": json.dumps({"layers": list(range(layers))})})
    return path


@pytest.mark.parametrize(
    "args, message",
    [
        (["-m", "fixed", "--radius", "0"], "--radius must be at least 1"),
        (["-m", "fixed", "--radius", "5000"], "--radius must be at most 4096"),
        (["-m", "tisa", "--kernels", "0"], "--kernels must be at least 1"),
        (["-m", "tisa", "--init", "gaussian"], "unknown --init 'gaussian'"),
        (["-m", "tisa", "--init", "fit:S0"], "S = 0 is no kernel"),
        (["-m", "tisa", "--kernels", "3", "--init", "fit:S5"], "--kernels 3 differs from the S = 5"),
        (["-m", "cat", "--init", "fit"], "only applies to TISA"),
    ],
)
def test_settings_are_checked_before_the_model_loads(tiny_checkpoints, tmp_path, capsys, monkeypatch, args, message):
    """Issue 8 #7 / 14 §2, §6: bad --radius/--kernels/--init -> exit 2 at once; the model is never loaded."""
    import time

    import posprobe.checkpoint.loading as loading

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(loading, "build_model", no_load)
    files = {"fit:S0": f"fit:{_kernels(tmp_path / 's0.safetensors', 0)}"}
    files["fit:S5"] = f"fit:{_kernels(tmp_path / 's5.safetensors', 5)}"
    args = [files.get(a, a) for a in args]
    start = time.perf_counter()
    code, captured = run_main(["retrofit", str(tiny_checkpoints["bert"]), "--out", str(tmp_path / "o"), *args], capsys)
    assert code == 2 and time.perf_counter() - start < 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posprobe: error:") and message in lines[0], lines
    assert not (tmp_path / "o").exists()


def test_kernels_from_the_file_are_said(tiny_checkpoints, tmp_path):
    path = _kernels(tmp_path / "k.safetensors", 2)
    out = tmp_path / "o"
    result = runner.invoke(
        app, ["retrofit", str(tiny_checkpoints["bert"]), "-m", "tisa", "--init", f"fit:{path}", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "S = 2 kernels per head, from" in result.output
    recipe = json.loads((out / "config.json").read_text())["posprobe"]
    assert (
        recipe["kernels"] == 2 and recipe["init"] == f"fit:{path}" and recipe["init_fit"]["kernels_file"] == str(path)
    )


def test_default_out_folder(tiny_checkpoints, tmp_path, monkeypatch):
    """Issue 15: retrofit has a default --out, posprobe-out/retrofit/<model label>-<mechanism>."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["retrofit", str(tiny_checkpoints["bert"]), "-m", "fixed", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["out"] == str(Path("posprobe-out") / "retrofit" / "bert-fixed")
    assert record["parameters_per_layer"] == "H·(2r+1)"
    assert load_model(tmp_path / record["out"]).config.posprobe["mechanism"] == "fixed"


def test_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from posprobe.cli import main\n"
        "for argv in (['--help'], ['retrofit', '--help'], ['params', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('IMPORTED' if 'torch' in sys.modules else 'LIGHT')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().endswith("LIGHT") and "composite" in result.stdout


def test_init_fit_fits_this_models_kernels(tiny_checkpoints, tmp_path):
    """`--init fit`: S = --kernels kernels fitted to the model's own profiles, then loaded into TISA."""
    out = tmp_path / "o"
    result = runner.invoke(
        app,
        ["retrofit", str(tiny_checkpoints["bert"]), "-m", "tisa", "--init", "fit", "--kernels", "2", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    model = load_model(out)
    recipe = model.config.posprobe
    assert recipe["kernels"] == 2 and recipe["init"] == "fit"  # not the path of a temporary file, deleted since
    fit = recipe["init_fit"]  # what made the fit instead: model, mode, S, window, layers
    assert fit["kernels_file"] is None and fit["model"] == str(tiny_checkpoints["bert"]) and fit["n_kernels"] == 2
    assert fit["mode"] == "paper" and fit["layers"] == [0, 1] and fit["window"] >= 1
    assert "posprobe-fit-" not in (out / "config.json").read_text()
    assert added_parameters(model) == 3 * 2 * 4 * 2
    tisa = model.encoder.layer[0].attention.self.posprobe_mechanisms[0]
    assert tisa.a.abs().sum() > 0  # fitted amplitudes, not the zero start


def test_a_partial_kernels_file_is_said(tiny_checkpoints, tmp_path, capsys):
    """`fit-tisa --layers 0` then `retrofit --init fit:FILE`: layer 1 starts at zero, and the user is told so."""
    from posprobe.errors import PosprobeWarning
    from posprobe.retrofitting.install import retrofit

    path = _kernels(tmp_path / "k.safetensors", 2, layers=1)
    args = ["retrofit", str(tiny_checkpoints["bert"]), "-m", "tisa", "--init", f"fit:{path}"]
    code, captured = run_main([*args, "--out", str(tmp_path / "o")], capsys)
    assert code == 0 and "note: " in captured.out and "layers [1] start at zero" in " ".join(captured.out.split())
    code, captured = run_main([*args, "--out", str(tmp_path / "j"), "--json"], capsys)
    assert code == 0 and "layers [1] start at zero" in json.loads(captured.out)["notes"][0]
    with pytest.warns(PosprobeWarning, match=r"layers \[1\] start at zero"):
        model = retrofit(str(tiny_checkpoints["bert"]), "tisa", init=f"fit:{path}")
    layers = model.bert.encoder.layer if hasattr(model, "bert") else model.encoder.layer
    assert torch.all(layers[1].attention.self.posprobe_mechanisms[0].a == 0)
    assert torch.all(layers[0].attention.self.posprobe_mechanisms[0].a == 1)
