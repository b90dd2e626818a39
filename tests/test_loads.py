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


def text_commands(command: str, bert, texts, llama, planted) -> list[str]:
    """The commands of `arguments`, and the other analyses of text: profiles, fhat and rotary with --text."""
    text = ["--text", str(texts), "--column", "sentence", "--max-length", "12"]
    more = {
        "profiles --text": ["profiles", str(bert), *text, "--min-texts", "4"],
        "fhat --text": ["fhat", str(bert), *text, "--min-texts", "4"],
        "rotary --text": ["rotary", str(llama[0]), "--text", str(llama[1]), "--max-length", "16", "--max-texts", "8"],
        "attention --edit": ["attention", str(llama[0]), "--text", str(llama[1]), "--max-length", "16",
                             "--max-texts", "8", "--edit", "head:0.1=mean"],
        "ablate": ["ablate", str(llama[0]), "--text", str(llama[1]), "--edit", "head:0.1", "--length", "16",
                   "--windows", "2", "--control", "random:1", "--seeds", "1"],
    }  # fmt: skip
    return more[command] if command in more else arguments(command, bert, texts, llama, planted)


# the default run keeps two commands (text batches with an =mean edit's first pass, and context's windows)
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(c, marks=() if c in ("attention --edit", "context") else pytest.mark.slow)
        for c in (
            "attention",
            "states",
            "context",
            "needle",
            "profiles --text",
            "fhat --text",
            "rotary --text",
            "attention --edit",
            "ablate",
        )
    ],  # fmt: skip
)
def test_every_forward_pass_on_text_runs_inside_the_one_run_loop(
    command, tiny_bert_folder, texts_file, llama_folder, planted_folder, tmp_path, monkeypatch, capsys
):
    """Issue 45's "one loop": each analysis of text drives its forward passes through `capture.loop.drive`, and the
    model (any transformers model, its inner stacks included) is never called outside it — the first-batch check
    against eager attention, an edit's mean pass and needle's greedy answers included; the model is resolved and
    built once."""
    import torch
    from transformers import PreTrainedModel

    from posprobe.capture import loop

    inside, drives, outside = [False], [], []
    original = loop.drive

    def drive(*args, **kwargs):
        drives.append(type(args[0]).__name__)
        inside[0] = True
        try:
            return original(*args, **kwargs)
        finally:
            inside[0] = False

    def called(module, args):
        if isinstance(module, PreTrainedModel) and not inside[0]:
            outside.append(type(module).__name__)

    monkeypatch.setattr(loop, "drive", drive)
    resolved = counted(monkeypatch, resolve, "_inspect_folder")  # and, as above, one resolution and one load
    built = counted(monkeypatch, loading, "_build_model")
    hook = torch.nn.modules.module.register_module_forward_pre_hook(called)
    try:
        main([*text_commands(command, tiny_bert_folder, texts_file, llama_folder, planted_folder),
              "--out", str(tmp_path / "o"), "--json"])  # fmt: skip
    except SystemExit as stop:
        assert stop.code in (0, None), capsys.readouterr().err
    finally:
        hook.remove()
    assert drives and not outside, (drives, outside)
    assert (len(resolved), len(built)) == (1, 1)
