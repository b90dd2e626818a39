"""How the CLI fails: Ctrl-C (a real SIGINT to a child process), full disks, failed runs leaving no empty
folder, `--version`, readable tables at 80 columns and no ANSI codes when stderr is not a terminal."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.cells import cell_len

from posprobe.cli import _INTERRUPTED, main

ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", **extra)
    env.pop("POSPROBE_DEBUG", None)
    return env


def run_main(args, capsys):
    """(exit code, captured output) of `main(args)`; 0 when it returns normally."""
    try:
        main(args)
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code or 0
    return code, capsys.readouterr()


def interrupt_when_folder_appears(cmd: list[str], out: Path, delay: float) -> subprocess.CompletedProcess:
    """Start `cmd` in its own process group with SIGINT at its default action (as a shell runs a foreground
    job), wait until it has created `out`, wait `delay` s more, then send SIGINT to the group (Ctrl-C)."""
    proc = subprocess.Popen(
        ["env", "--default-signal=INT", *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the command ended before it could be interrupted: {proc.communicate()}"
    time.sleep(delay)
    assert proc.poll() is None, "the command ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.mark.slow  # a real process, Ctrl-C'd
def test_ctrl_c_during_fit_tisa_exits_130_with_one_line_and_no_files(tmp_path):
    out = tmp_path / "fit"
    done = interrupt_when_folder_appears(
        [
            sys.executable,
            "-m",
            "posprobe",
            "fit-tisa",
            "--kernels",
            "12",
            "--window",
            "64",
            "--json",
            "--out",
            str(out),
        ],
        out,
        delay=1.5,
    )
    assert done.returncode == 130, done
    assert json.loads(done.stdout) == {"error": _INTERRUPTED, "hint": None, "exit_code": 130}  # --json: one object
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posprobe: error: interrupted"), done.stderr
    assert not out.exists()  # the folder it created is gone, with nothing half-written in it


def test_ctrl_c_during_an_analysis_exits_130(tmp_path):
    """`toeplitz` held in its analysis (a sleep patched in before it) while the SIGINT arrives."""
    out = tmp_path / "toeplitz"
    code = (
        "import time, posprobe.pipelines.weights as a; real = a.toeplitz; "
        "a.toeplitz = lambda *x, **k: (time.sleep(60), real(*x, **k))[1]; "
        "from posprobe.cli import main; main()"
    )
    done = interrupt_when_folder_appears(
        [sys.executable, "-c", code, "toeplitz", "--json", "--out", str(out)], out, delay=0.3
    )
    assert done.returncode == 130 and json.loads(done.stdout)["exit_code"] == 130, done
    assert done.stderr.startswith("posprobe: error: interrupted") and len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_full_disk_is_one_line_with_no_folder_left(monkeypatch, tmp_path, capsys):
    """ENOSPC while the figure is written: exit 2, one line, no temporary file and no (empty) folder."""
    from matplotlib.figure import Figure

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    out = tmp_path / "deep" / "out"
    code, captured = run_main(["toeplitz", "--out", str(out)], capsys)
    assert code == 2
    assert captured.err.startswith("posprobe: error: cannot write") and "No space left" in captured.err
    assert "free some disk space" in captured.err and len(captured.err.strip().splitlines()) == 1
    assert not (tmp_path / "deep").exists()


def test_full_disk_in_the_final_rename_keeps_the_existing_folder_clean(monkeypatch, tmp_path, capsys):
    """ENOSPC at any step of the atomic write, into a folder that existed: it stays, with no temporary file."""
    import posprobe.formats.writing as outputs

    real_replace = os.replace

    def full(src, dst):
        if str(dst).endswith(".json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(outputs.os, "replace", full)
    code, captured = run_main(["toeplitz", "--out", str(tmp_path)], capsys)
    assert code == 2 and "No space left" in captured.err
    assert tmp_path.is_dir() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_failed_run_leaves_no_empty_out_folder(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "a" / "b"
    code, captured = run_main(["fhat", str(tiny_checkpoints["bert"]), "--layer", "9", "--out", str(out)], capsys)
    assert code == 2 and captured.err.startswith("posprobe: error:")
    assert not (tmp_path / "a").exists()
    code, _ = run_main(["fit-tisa", str(tiny_checkpoints["bert"]), "--layers", "7", "--out", str(out)], capsys)
    assert code == 2 and not (tmp_path / "a").exists()


def test_fit_tisa_refuses_too_many_kernels_at_once(tmp_path, capsys):
    """--kernels 100 has 301 parameters for 33 points: refused before any profile is computed."""
    start = time.perf_counter()
    code, captured = run_main(["fit-tisa", "--kernels", "100", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and time.perf_counter() - start < 2
    assert "--kernels 100 needs 301 profile points" in captured.err and "at most 10 kernels" in captured.err
    assert not (tmp_path / "o").exists()
    code, captured = run_main(["fit-tisa", "--kernels", "3,43", "--window", "64", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--kernels 43 needs 130" in captured.err and "129" in captured.err


def test_version(capsys):
    from posprobe.version import __version__

    code, captured = run_main(["--version"], capsys)
    assert code == 0 and captured.out.strip() == f"posprobe {__version__}"


def _widest_table_line(stdout: str, tmp_path: Path) -> int:
    """Widest stdout line, leaving out the lines that name an output path: those are never wrapped off a terminal
    (issue 23: a path split in two cannot be copied), tables are laid out to fit."""
    return max(cell_len(line) for line in stdout.splitlines() if str(tmp_path) not in line)


@pytest.mark.slow
def test_tables_fit_80_columns_without_ansi_codes(tmp_path):
    """Piped stdout (not a terminal) at COLUMNS=80: no escape codes, no table line over 80, R² values whole,
    and paths whole on one line."""
    cmd = [sys.executable, "-m", "posprobe", "fit-tisa", "--kernels", "1,5", "--layers", "0", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(COLUMNS="80"), timeout=300)
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout and _widest_table_line(done.stdout, tmp_path) <= 80
    assert any(line.endswith("tisa_kernels_S5_layers0.safetensors") for line in done.stdout.splitlines())
    assert "1.…" not in done.stdout and "tisa_kernels_S5_layers0.safetensors" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "posprobe", "fit-tisa", "--kernels", "5", "--layers", "0", "--out", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        env=child_env(COLUMNS="80"),
        timeout=300,
    )
    assert done.returncode == 0 and "\x1b[" not in done.stdout
    assert _widest_table_line(done.stdout, tmp_path) <= 80
    per_head = done.stdout.split("R² per head")[1].split("median")[0]  # 12 heads fit across 80 columns
    assert "…" not in per_head and len(re.findall(r"\b[01]\.\d{3}\b", per_head)) == 12


def test_compare_needs_two_models_and_shows_labels(tiny_checkpoints, tmp_path, capsys):
    code, captured = run_main(["compare", str(tiny_checkpoints["bert"]), "--out", str(tmp_path / "c")], capsys)
    assert code == 2 and "two or more models" in captured.err and not (tmp_path / "c").exists()
    a, b = tmp_path / "runs" / "a" / "ckpt", tmp_path / "runs" / "b" / "ckpt"
    import shutil

    shutil.copytree(tiny_checkpoints["bert"], a)
    shutil.copytree(tiny_checkpoints["roberta"], b)
    code, captured = run_main(
        ["compare", str(a), str(tiny_checkpoints["gpt2"]), "--json", "--out", str(tmp_path)], capsys
    )
    assert code == 0
    record = json.loads(captured.out)
    assert [m["label"] for m in record["models"]] == ["ckpt", tiny_checkpoints["gpt2"].name]
    code, captured = run_main(["compare", str(a), str(b), "--json", "--out", str(tmp_path)], capsys)
    labels = [m["label"] for m in json.loads(captured.out)["models"]]
    assert len(set(labels)) == 2  # same folder name: told apart by their (middle-shortened) paths


def test_compare_table_at_80_columns(tiny_checkpoints, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    deep = tmp_path / ("a-very-long-folder-name-" * 3) / "checkpoint-with-a-long-name-as-well"
    import shutil

    shutil.copytree(tiny_checkpoints["bert"], deep)
    code, captured = run_main(
        ["compare", str(deep), str(tiny_checkpoints["gpt2"]), "--out", str(tmp_path / "c")], capsys
    )
    table = captured.out.split("figure:")[0]  # the figure's path is as long as it is
    assert code == 0 and max(cell_len(line) for line in table.splitlines()) <= 80
    assert "…" in captured.out or "checkpoint-with-a-long-name-as-well" in captured.out
    assert str(tmp_path) not in captured.out.split("figure:")[0]  # labels, not paths, in the table


def test_undefined_r2_reads_undefined_in_text_and_null_in_json(monkeypatch, tmp_path, capsys):
    """The library reports an undefined R² (constant matrix) as None / NaN; the CLI words it."""
    import numpy as np

    import posprobe.pipelines.weights as pipelines
    from posprobe.pipelines.weights import FhatResult, ToeplitzResult

    const = np.ones((8, 8))
    monkeypatch.setattr(
        pipelines,
        "toeplitz",
        lambda *a, **k: ToeplitzResult("m", "bert", 8, 0, False, const, None, {4: None}),
    )
    monkeypatch.setattr(
        pipelines,
        "fhat",
        lambda *a, **k: FhatResult("m", "bert", 0, 0, "paper", np.stack([const, np.eye(8)]), np.array([np.nan, 0.5])),
    )
    code, captured = run_main(["toeplitz", "--out", str(tmp_path / "t")], capsys)
    assert code == 0 and "undefined (constant matrix)" in captured.out
    code, captured = run_main(["toeplitz", "--json", "--out", str(tmp_path / "t")], capsys)
    assert code == 0 and json.loads(captured.out)["toeplitz_r2"] is None
    code, captured = run_main(["fhat", "--out", str(tmp_path / "f")], capsys)
    assert code == 0 and "undefined (constant matrix)" in captured.out and "0.5000" in captured.out


@pytest.mark.parametrize(
    "args, words",
    [
        (["toeplitz", "--format", "jpg"], "'jpg' is not one of"),
        (["fhat", "--layer", "1.5"], "--layer"),
        (["toeplitz", "--block", "x"], "--block"),
        (["finetune", "--task", "cola", "--max-steps", "1"], "No such option: --max-steps"),
        (["nosuchcmd"], "No such command"),
        (["compare"], "Missing argument"),
    ],
)
def test_usage_errors_are_one_line(args, words, capsys):
    """A bad flag is one `posprobe: error:` line naming the command's help, exit 2 (not click's 4-line block)."""
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and err.startswith("posprobe: error: ") and "\n" not in err
    assert words in err and "--help`" in err
    assert "Value error" not in err and ". —" not in err  # click's wording of a choice error, cleaned


def test_fhat_last_layer_is_named_by_its_number(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "f"
    code, captured = run_main(["fhat", str(tiny_checkpoints["bert"]), "--layer", "-1", "--out", str(out)], capsys)
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["fhat_layer1_paper.json", "fhat_layer1_paper.png"]
    assert "layer 1" in captured.out


def test_toeplitz_says_when_the_default_block_is_skipped(tiny_checkpoints, tmp_path, capsys):
    code, captured = run_main(["toeplitz", str(tiny_checkpoints["bert"]), "--out", str(tmp_path / "t")], capsys)
    assert code == 0
    assert "block 128 skipped: the table has only 64 positions" in " ".join(captured.out.split())


def test_compare_default_folder_name_stays_short(tiny_checkpoints, tmp_path, capsys, monkeypatch):
    """Four models with long folder names made a default folder name over the 255-byte limit (OSError)."""
    import shutil

    from posprobe.formats.writing import SLUG_MAX, slug

    models = []
    for i in range(4):
        folder = tmp_path / f"a-very-long-checkpoint-folder-name-for-a-fine-tuned-bert-model-number-{i}"
        shutil.copytree(tiny_checkpoints["bert"], folder)
        models.append(str(folder))
    monkeypatch.chdir(tmp_path)
    code, captured = run_main(["compare", *models, "--json"], capsys)
    assert code == 0, captured.err
    folder = Path(json.loads(captured.out)["record"]).parent
    assert folder.parent == Path("posprobe-out/compare") and len(folder.name) <= SLUG_MAX
    assert slug("x" * 300) != slug("x" * 299 + "y") and slug("org/model") == "org--model"


def test_error_wording_fits_where_it_is_read(tiny_checkpoints, tmp_path, capsys):
    """Reviewer wording defects: flags in CLI hints and keywords in library hints; one layer said as such;
    a missing evaluate folder says it does not exist."""
    from posprobe.errors import ArgumentValueError
    from posprobe.pipelines.weights import _layer_index

    err = ArgumentValueError("kernels", "{arg} 0 is too few", "e.g. {arg=5} or {arg}")
    assert err.render(cli=True) == "--kernels 0 is too few — e.g. --kernels 5 or --kernels"
    assert str(err) == "kernels 0 is too few — e.g. kernels=5 or kernels"
    with pytest.raises(ArgumentValueError) as info:
        _layer_index(3, 1, "m")
    assert info.value.render(cli=True) == "layer 3 does not exist: 'm' has only layer 0 — pass --layer 0"
    code, captured = run_main(["fit-tisa", str(tiny_checkpoints["bert"]), "--kernels", "0"], capsys)
    assert code == 2 and "e.g. --kernels 5" in captured.err and "kernels=" not in captured.err
    code, captured = run_main(["evaluate", str(tmp_path / "nowhere"), "--task", "sst2"], capsys)
    assert code == 2 and f"'{tmp_path / 'nowhere'}' does not exist" in " ".join(captured.err.split())


def test_lines_are_not_wrapped_off_a_terminal(tiny_checkpoints, tmp_path, capsys):
    """Issue 23: with stderr not a terminal (a pipe, a log), a long output path stays on one line."""
    out = tmp_path / ("a-folder-name-long-enough-to-pass-eighty-columns-" * 2) / "toeplitz"
    code, captured = run_main(["toeplitz", str(tiny_checkpoints["bert"]), "--out", str(out)], capsys)
    assert code == 0
    assert any(line.endswith(str(out / "P.png")) for line in captured.out.splitlines()), captured.err


def test_an_out_of_range_number_says_what_to_do(capsys):
    """Issue 23: `--block 0` says what is wrong and what to pass instead."""
    code, captured = run_main(["toeplitz", "--block", "0"], capsys)
    assert (
        code == 2
        and captured.err.strip() == "posprobe: error: --block must be at least 1, got 0 — pass --block of 1 or more"
    )


@pytest.mark.slow  # a real process, SIGTERM'd
def test_sigterm_while_a_file_is_written_leaves_no_hidden_temporary_file(tmp_path):
    """Issue 23: a real SIGTERM (kill, a scheduler) arriving while a result file is being written: the run
    cleans up as for Ctrl-C (exit 143, one line, no staged or temporary file, no folder it created)."""
    out = tmp_path / "toeplitz"
    code = (
        "import time, posprobe.formats.writing as o; real = o._savefig; "
        "o._savefig = lambda fig, p, *a: (p.write_bytes(b'partial'), time.sleep(60), real(fig, p, *a)); "
        "from posprobe.cli import main; main()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "toeplitz", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        start_new_session=True,
    )
    deadline = time.monotonic() + 120

    def hidden() -> list[Path]:  # a staged or temporary file (`.posprobe-staging-*/P.png`, `.P.png.*`)
        return [p for p in out.rglob("*") if any(part.startswith(".") for part in p.relative_to(out).parts)]

    while not any(p.name == "P.png" or p.name.startswith(".P.png") for p in hidden()) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posprobe: error: terminated"), stderr
    assert not out.exists()


def test_help_text_wraps_at_the_terminal_not_at_the_source(capsys, monkeypatch):
    """`--help` rewraps each docstring paragraph to the terminal: no line of a command's description ends a
    sentence-middle fragment of one or two words (typer in rich mode kept the docstring's 116-column line breaks,
    so at 100 columns 'rotary' read '... averaged over real tokens with' / '--text. Rotary families only.')."""
    from posprobe.cli import app, reflow_help

    assert reflow_help("A b\n    c d.\n\n    E f\n    - g\n    - h") == "A b c d.\n\nE f\n- g\n- h"
    monkeypatch.setenv("COLUMNS", "100")
    for command in app.registered_commands:
        main([command.name, "--help"])
        text = capsys.readouterr().out.split("╭")[0]  # the description, above the option panels
        lines = [line.strip() for line in text.splitlines()[3:] if line.strip()]
        assert lines, command.name
        short = [line for line in lines[:-1] if len(line) < 40 and not line.endswith((".", ":"))]
        assert not short, (command.name, short)


@pytest.mark.slow
@pytest.mark.parametrize("n_layers", [3, 12])
def test_attention_tables_fit_80_columns_with_many_layers(n_layers, tmp_path, capsys, monkeypatch):
    """`attention` at COLUMNS=80 off a terminal: a 30-layer model's heads x layers table came out as 30 columns of
    empty cells; with more layers than fit, the distances are summarised per layer (median, min, max over heads),
    every cell holding a number."""
    from conftest import build_tiny
    from tiny_tokenizer import word_tokenizer

    folder = tmp_path / "model"
    build_tiny("bert", num_hidden_layers=n_layers).save_pretrained(folder)
    word_tokenizer(60).save_pretrained(folder)
    (tmp_path / "t.txt").write_text("".join(f"w{i} w{i + 1} w{i + 2} w3 w4 w5\n" for i in range(20)))
    monkeypatch.setenv("COLUMNS", "80")
    args = ["attention", str(folder), "--text", str(tmp_path / "t.txt"), "--max-length", "8"]
    code, captured = run_main([*args, "--out", str(tmp_path / "out")], capsys)
    assert code == 0, captured.err
    assert max(cell_len(line) for line in captured.out.splitlines() if line[:1] in "┏┃┡│└") <= 80
    table = captured.out.split("Attention sinks")[0]
    rows = [line for line in table.splitlines() if re.match(r"^[│|]\s*(L|h)\d+\s", line)]
    assert len(rows) == (n_layers if n_layers > 8 else 4), table  # a row per layer, or per head (4 heads)
    for row in rows:
        cells = [c.strip() for c in row.strip("│| ").split("│")]
        assert all(re.fullmatch(r"-?\d+\.\d\d|—", c) for c in cells[1:]) and len(cells) > 3, row


def test_a_json_run_hands_the_console_back_to_stdout(tmp_path, capsys):
    """`--json` moves results printed through the console to stderr for that run only: a later call in the same
    process (a notebook cell, a test that runs the app without `main`) prints its results on stdout again."""
    from posprobe.cli import console, main

    with pytest.raises(SystemExit) as stop:
        main(["toeplitz", str(tmp_path / "no-such-model"), "--json"])
    assert stop.value.code == 2
    capsys.readouterr()
    console.console.print("a result line")
    assert "a result line" in capsys.readouterr().out
