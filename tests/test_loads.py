"""Each command resolves its model once and loads it once (issue 45): the checkpoint is read (config, headers) by
one resolution, and transformers builds the model once, whatever layers the command goes through."""

# ruff: noqa: F811 - the fixtures imported from the other test modules are parameters of the test below
from __future__ import annotations

import pytest
from test_attention import texts_file, tiny_bert_folder, tiny_model  # noqa: F401 - fixtures
from test_context import llama_folder  # noqa: F401 - fixture
from test_needle import TASK_FLAGS, planted_folder  # noqa: F401 - fixture

from posprobe.checkpoint import loading, resolve
from posprobe.cli import main


def counted(monkeypatch, module, name: str) -> list:
    calls, original = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(args[:1])
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def arguments(command: str, bert, texts, llama, planted) -> list[str]:
    text = ["--text", str(texts), "--column", "sentence", "--max-length", "12"]
    return {
        "attention": ["attention", str(bert), *text],
        "states": ["states", str(bert), *text, "--min-texts", "4"],
        "context": ["context", str(llama[0]), "--text", str(llama[1]), "--lengths", "16", "--windows", "1"],
        "needle": [
            "needle",
            str(planted),
            "--haystack",
            str(planted / "haystack.txt"),
            "--lengths",
            "150",
            "--depths",
            "0.5",
            "--trials",
            "1",
            *TASK_FLAGS,
        ],  # fmt: skip
    }[command]


# the default run keeps one command; the slow tier (CI) runs the four
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(c, marks=() if c == "context" else pytest.mark.slow)
        for c in ("attention", "states", "context", "needle")
    ],
)
def test_a_command_resolves_and_loads_its_model_once(
    command, tiny_bert_folder, texts_file, llama_folder, planted_folder, tmp_path, monkeypatch, capsys
):
    resolved = counted(monkeypatch, resolve, "_inspect_folder")  # what resolving a folder reads
    built = counted(monkeypatch, loading, "_build_model")  # transformers building the model
    args = arguments(command, tiny_bert_folder, texts_file, llama_folder, planted_folder)
    try:
        main([*args, "--out", str(tmp_path / "o"), "--json"])
    except SystemExit as stop:
        assert stop.code in (0, None), capsys.readouterr().err
    assert (len(resolved), len(built)) == (1, 1)
