"""Hostile input to the commands added with GGUF, attention sinks, data-conditioned scores, `rotary` and `states`:
each bad input is one `posprobe: error: <what> — <what to do>` line on stderr, exit 2, no output folder, nothing on
stdout; cheap checks come before the model is read; off a terminal stderr carries no blank line, ANSI code or bar.

Inputs are real files (damaged text files, models whose tokenizer files are missing or belong to another model),
run through `posprobe.cli.main` in this process (stderr captured, so not a terminal); the slow tier runs the
installed command as a child process.
"""

# ruff: noqa: F811 - the fixtures imported from test_attention are parameters of the tests below
from __future__ import annotations

import json
import shutil

import pytest
from test_attention import texts_file, tiny_bert_folder, tiny_model  # noqa: F401 - fixtures

from posprobe.cli import main


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `posprobe ARGS` run in this process."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, out: str, err: str, *words: str) -> str:
    """Exit 2, nothing on stdout, exactly one `posprobe: error: what — what to do` line on stderr holding `words`."""
    lines = err.splitlines()
    assert code == 2 and out == "", (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("posprobe: error: ") and " — " in lines[0], err
    assert "internal error" not in err and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], err
    return lines[0]


@pytest.fixture(scope="module")
def tiny_llama_folder(tiny_bert_folder, tmp_path_factory):
    """A tiny rotary Llama (GQA) with the tiny BERT's WordPiece tokenizer (the same 65 ids fit its 99 rows)."""
    folder = tmp_path_factory.mktemp("tiny-llama-tok")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_bert_folder / name, folder / name)
    tiny_model("llama").save_pretrained(folder)
    return folder


# -- stderr off a terminal --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command",
    [
        "states",
        "rotary",
        pytest.param("attention", marks=pytest.mark.slow),
        pytest.param("profiles", marks=pytest.mark.slow),
    ],
)
def test_text_runs_write_nothing_on_stderr_off_a_terminal(
    command, tiny_bert_folder, tiny_llama_folder, texts_file, tmp_path, capsys
):
    """The progress bar over texts is drawn only on a terminal: rich's transient display still ended with a blank
    line on a pipe, so `--json` runs wrote a stray empty line to stderr (and error lines came second)."""
    model = tiny_llama_folder if command in ("rotary", "profiles") else tiny_bert_folder
    args = [command, model, "--text", texts_file, "--column", "sentence", "--max-length", "12"]
    code, out, err = run_cli([*args, "--out", tmp_path / "out", "--json"], capsys)
    assert code == 0 and err == "", err
    assert len(out.splitlines()) == 1 and isinstance(json.loads(out), dict)
