"""`posprobe retrofit` through typer's runner (JSON contract) and through `main` (errors -> one line, exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from posprobe.cli import app, main
from posprobe.retrofit import added_parameters, load_model

runner = CliRunner()


def run_main(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code, capsys.readouterr()


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
