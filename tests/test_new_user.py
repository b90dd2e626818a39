"""What a new user meets first (issue 31): text commands that run with no file, results on stdout and progress on
stderr, a JSON error object under `--json`, `--help` readable at 80 columns, a GLUE-format sample in the box."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rich.cells import cell_len
from test_attention import tiny_bert_folder  # noqa: F401 - fixture

from posprobe.cli import app, main


def run_cli(args, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `posprobe ARGS` run in this process."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def command_names() -> list[str]:
    return [command.name for command in app.registered_commands]


@pytest.mark.parametrize("command", command_names())
def test_help_at_80_columns_cuts_nothing_and_flags_take_no_value(command, capsys, monkeypatch):
    """`COLUMNS=80 posprobe COMMAND --help`: no option's help cut with '…' (7 commands cut `--data-dir`, `--out`,
    `--text`), and a flag is listed without a type (`--json <bool>` read as if it took a value)."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli([command, "--help"], capsys)
    assert code == 0 and "Usage:" in out
    assert "…" not in out, [line for line in out.splitlines() if "…" in line]
    assert "<bool>" not in out
    assert max(cell_len(line) for line in out.splitlines()) <= 80
    for flag in ("--json", "--help"):
        lines = [line for line in out.splitlines() if f" {flag} " in line]
        if lines:
            assert not any("<" in line.split(flag)[1].split()[0] for line in lines if line.split(flag)[1].split())


def test_results_go_to_stdout_and_nothing_else_to_stderr(tiny_checkpoints, tmp_path, capsys):
    """`posprobe toeplitz > r.txt` gave an empty file: the table went to stderr."""
    code, out, err = run_cli(["toeplitz", tiny_checkpoints["bert"], "--out", tmp_path / "t"], capsys)
    assert code == 0 and err == ""
    assert "R² whole" in out and str(tmp_path / "t" / "P.png") in out
    code, out, err = run_cli(["toeplitz", tiny_checkpoints["bert"], "--out", tmp_path / "j", "--json"], capsys)
    assert code == 0 and err == "" and json.loads(out)["n_positions"] == 64  # one object, no table beside it


@pytest.mark.parametrize(
    "args, error, hint",
    [
        (["fhat", "--layer", "99"], "layer 99 does not exist", "pass --layer between 0 and 5"),
        (["fhat", "--layer", "x"], "Invalid value for '--layer'", "fhat --help`"),
        (["attention", "--text", "builtin:nope"], "'builtin:nope' is not a builtin text", "builtin:sentences"),
    ],
)
def test_a_failure_under_json_prints_one_error_object(args, error, hint, tmp_path, capsys):
    """With `--json` a script always gets one JSON object: the error and its hint, and the exit code; stderr keeps
    its one line."""
    code, out, err = run_cli([*args, "--json", "--out", tmp_path / "o"], capsys)
    record = json.loads(out)
    assert code == 2 and set(record) == {"error", "hint", "exit_code"} and record["exit_code"] == 2
    assert error in record["error"] and hint in record["hint"] and " — " not in record["error"]
    assert err.count("\n") == 1 and err.startswith("posprobe: error: ") and record["error"] in err
    assert not (tmp_path / "o").exists()
    code, out, err = run_cli(args + ["--out", tmp_path / "o"], capsys)  # without --json: stdout stays empty
    assert code == 2 and out == "" and error in err


@pytest.mark.slow
def test_attention_and_states_read_the_packaged_sentences_without_text(tiny_bert_folder, tmp_path, capsys):  # noqa: F811
    """`posprobe attention` said "Missing option '--text'"; now it reads builtin:sentences (144 texts)."""
    from posprobe.corpora import SENTENCES, iter_builtin

    n = sum(1 for _ in iter_builtin(SENTENCES))
    for command in ("attention", "states"):
        out_dir = tmp_path / command
        code, out, err = run_cli([command, tiny_bert_folder, "--max-length", "12", "--out", out_dir, "--json"], capsys)
        assert code == 0, err
        record = json.loads(out)
        assert record["n_texts"] == n == 144, command
        assert record.get("text", SENTENCES) == SENTENCES


@pytest.mark.slow
@pytest.mark.integration
def test_attention_runs_on_the_packaged_model_with_no_argument_at_all(tmp_path, capsys, monkeypatch):
    """The README's Quick start text command, as a new user types it: `posprobe attention` (MiniLM, the packaged
    sentences), a table on stdout."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["attention"], capsys)
    assert code == 0, err
    assert "Mean attention distance (tokens) — all-MiniLM-L6-v2, 144 texts" in out
    assert (tmp_path / "posprobe-out" / "attention" / "all-MiniLM-L6-v2").is_dir()


def test_the_glue_sample_loads_for_finetune_and_is_what_its_script_writes(tmp_path):
    """`--data-dir builtin:glue` (or `posprobe/corpora/glue` in a clone): cola and sst2, both labels in every split,
    and the committed files are exactly what `make_sample.py` writes (nothing edited by hand)."""
    import importlib.util
    import random

    from posprobe.corpora import glue_sample_dir
    from posprobe.glue.data import load_glue

    for task in ("cola", "sst2"):
        for data_dir in ("builtin:glue", glue_sample_dir()):
            splits = load_glue(task, data_dir)
            assert {name: len(split) for name, split in splits.items()} == {"train": 240, "validation": 80}
            for split in splits.values():
                assert set(split.labels) == {0, 1}
    spec = importlib.util.spec_from_file_location("make_sample", glue_sample_dir() / "make_sample.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write(tmp_path / "cola", module.cola_example, random.Random(module.SEED))
    module.write(tmp_path / "sst2", module.sst2_example, random.Random(module.SEED + 1))
    for task in ("cola", "sst2"):
        for split in ("train", "validation"):
            assert (tmp_path / task / f"{split}.jsonl").read_bytes() == (
                glue_sample_dir() / task / f"{split}.jsonl"
            ).read_bytes()


def test_finetune_hub_hint_names_the_sample_offline(monkeypatch):
    """Offline without --data-dir, the refusal names the packaged sample for the two tasks it holds."""
    from posprobe.errors import PosprobeError
    from posprobe.glue import data

    def offline(name, config, split, what, hint):
        raise PosprobeError(f"{what} is not available offline", hint)

    monkeypatch.setattr(data, "load_hub_dataset", offline)
    with pytest.raises(PosprobeError, match="builtin:glue"):
        data.load_glue("cola")
    with pytest.raises(PosprobeError) as info:
        data.load_glue("rte")
    assert "builtin:glue" not in str(info.value)


def test_long_phases_say_what_they_do(tiny_bert_folder, monkeypatch):  # noqa: F811
    """`states` sat at 0/300 texts, then at 300/300, with no word: reading the weights and fitting the probes are now
    named as they begin (`posprobe.runtime.phases`); the CLI shows them on a terminal, as one dim line each."""
    import io

    from rich.console import Console

    import posprobe
    from posprobe.cli import console
    from posprobe.runtime.phases import phase, reporting_phases

    said: list[str] = []
    with reporting_phases(said.append):
        posprobe.states(str(tiny_bert_folder), ["w1 w2 w3 w4"] * 6, max_length=8, min_texts=2)
    phase("outside the block: nobody listens")  # no listener: nothing happens
    assert said[0].startswith("reading the weights of ") and str(tiny_bert_folder) in said[0]
    start = next(i for i, line in enumerate(said) if line.startswith("fitting the position probes of 3 hidden states"))
    assert said[start + 1 :] == [  # issue 49: then each hidden state as it is fitted, and the baseline
        *(f"fitting the position probes: hidden state {k} of 2 ({k + 1} of 3)" for k in range(3)),
        "fitting the position probes: the baseline (first-token flag and text length)",
    ]
    terminal = Console(file=io.StringIO(), force_terminal=True, width=200)
    monkeypatch.setattr(console, "log_console", terminal)
    console.show_phase("reading the weights of [model]")
    assert "reading the weights of [model]…" in terminal.file.getvalue()


def test_fhat_defaults_show_what_is_there(tiny_bert_folder):  # noqa: F811
    """`fhat --text F` on a model with a learned table defaulted to the 'mean' input, constant by construction
    (every score of a head one number, R² undefined); the default is now 'position-mean' there and 'mean' for a
    relative mechanism (whose 'mean' scores show it). The grid's default colour scale is per head, and the title
    says so (one head with large scores made ten of twelve shared-scale panels look empty)."""
    from family_models import build

    import posprobe
    from posprobe.pipelines.data_conditioned import default_input
    from posprobe.plotting import base as plotting

    texts = [" ".join(f"w{(7 * t + i) % 60}" for i in range(10)) for t in range(8)]
    result = posprobe.fhat(str(tiny_bert_folder), texts=texts, min_texts=2)
    assert result.conditioning["input"] == "position-mean"
    assert np.isfinite(np.asarray(result.toeplitz_r2, dtype=float)).all()  # defined: the scores vary
    forced = posprobe.fhat(str(tiny_bert_folder), texts=texts, input="mean")
    assert all(np.ptp(m) < 1e-9 for m in forced.matrices)  # what the old default gave: one number per head
    assert default_input("rotary") == "mean" and default_input("learned") == "position-mean"
    llama = build("llama")
    assert posprobe.fhat(llama, input_ids=[[3, 4, 5, 6, 7, 8]] * 4).conditioning["input"] == "mean"
    assert "each head its own colour scale" in plotting.fhat_grid(result).title
    assert "one colour scale for all heads" in plotting.fhat_grid(result, scale="shared").title


def test_fhat_command_and_the_readme_figure_use_the_per_head_default(tiny_bert_folder, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Issue 31 item 5: the README showed `fhat --scale shared` (head 2's scores paled ten panels) while the command
    draws each head on its own scale. The command without `--scale` draws per head, and the README's figure is made
    by `regenerate.sh` with the command's defaults (no `--scale`), so it is the figure a user gets."""
    from pathlib import Path

    from posprobe.plotting import base as plotting

    drawn, real = [], plotting.fhat_grid

    def recording(result, scale="per-head"):
        drawn.append(scale)
        return real(result, scale)

    monkeypatch.setattr(plotting, "fhat_grid", recording)
    code, _, err = run_cli(["fhat", tiny_bert_folder, "--out", tmp_path / "fhat"], capsys)
    assert code == 0 and drawn == ["per-head"], err
    root = Path(__file__).resolve().parents[1]
    for script in ("figures/regenerate.sh", "figures/README.md"):
        lines = [x for x in (root / script).read_text().splitlines() if "--out figures/fhat/" in x]
        assert lines and all(x.split("#")[0].split() == ["posprobe", "fhat", "--out", "figures/fhat/all-MiniLM-L6-v2"]
                             for x in lines), (script, lines)  # fmt: skip


def test_grid_table_of_every_metric_keeps_each_row_on_one_line_at_80_columns():
    """The grid's Δ cell (mean ± s.e. [95% interval], p) took 4 lines at 80 columns: the terminal table now has Δ
    and p columns (the interval stays in the main-metric table and results.md), each row one line."""
    import io

    from rich.console import Console

    from posprobe.cli.finetune import _all_metrics_table, _grid_table

    delta = {"mean": 0.016, "stderr": 0.018, "ci95": [-0.019, 0.052], "p_value": 0.5, "n": 3, "p_exact": True}
    summary = [
        {"task": "mrpc", "metric": metric, "mechanism": mech, "median": 0.8123, "mean": 0.8101, "stderr": 0.0123,
         "n": 3, "delta": None if mech == "none" else delta}
        for metric in ("f1", "accuracy") for mech in ("none", "composite")
    ]  # fmt: skip
    title, header, rows = _all_metrics_table({"mechanisms": ["none", "composite"], "summary": summary})
    assert rows[1][-2:] == ["+0.0160 ± 0.0180", "0.5"] and rows[0][-2:] == ["baseline", ""]
    table = _grid_table(title, header, rows)
    console = Console(file=io.StringIO(), width=80)
    console.print(table)
    text = console.file.getvalue()
    body = text.split("─")[-1].strip("\n").splitlines()  # under the header rule
    assert len(body) == 4 and all(line.lstrip().startswith("mrpc") for line in body), text  # a row, a line
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80


@pytest.mark.slow
def test_params_title_and_fit_tisa_sweep_fit_80_columns(tiny_checkpoints, tmp_path, capsys, monkeypatch):
    """`params`' title was 85–92 columns; `fit-tisa --kernels 1,3,5` folded a kernels file name over two lines."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli(["params", tiny_checkpoints["bert"]], capsys)
    title = out.split("┏")[0].splitlines()
    assert code == 0 and len(title) == 2 and max(cell_len(line) for line in title) <= 80
    assert title[0].startswith("Positional parameters — ") and title[1].startswith("n=64, d=32, H=4, L=2")
    code, out, _ = run_cli(["fit-tisa", tiny_checkpoints["bert"], "--kernels", "1,3", "--out", tmp_path], capsys)
    names = [line for line in out.splitlines() if ".safetensors" in line]
    assert code == 0 and [line.split(": ")[0] for line in names] == ["S=1", "S=3"]
    assert all(line.endswith(".safetensors") and "tisa_kernels_S" in line for line in names)


@pytest.mark.slow  # two fresh processes
def test_tables_written_to_a_file_keep_every_header_whole(tiny_bert_folder, tmp_path):  # noqa: F811
    """`posprobe attention > r.txt` printed 'unifo…' for three headers of the sinks table, and context's title
    wrapped (issue 49): off a terminal a table keeps its natural width and its title one line. Run as a user
    runs it, stdout redirected to a file."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from test_context import tiny_llama
    from tiny_tokenizer import causal_folder

    llama = tmp_path / "llama"
    causal_folder(llama, tiny_llama())
    texts = tmp_path / "docs.txt"
    rng = np.random.default_rng(1)
    texts.write_text("".join(" ".join(f"w{x}" for x in rng.integers(0, 60, size=30)) + "\n" for _ in range(20)))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), HF_HUB_OFFLINE="1", COLUMNS="80")
    runs = {
        "attention": ["attention", str(tiny_bert_folder), "--max-length", "12", "--max-texts", "8"],
        "context": ["context", str(llama), "--text", str(texts), "--lengths", "16,48", "--rope-scaling", "none,yarn:2"],
    }
    for name, args in runs.items():
        path = tmp_path / f"{name}.txt"
        with path.open("w") as file:
            done = subprocess.run([sys.executable, "-m", "posprobe", *args, "--out", str(tmp_path / name)],
                                  stdout=file, stderr=subprocess.PIPE, text=True, env=env, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        text = path.read_text()
        assert "…" not in text, [line for line in text.splitlines() if "…" in line]
        if name == "attention":  # every header of the sinks table, whole, on the header line
            table = text.split("Attention sinks per layer")[1]
            cells = [line.split("┃")[1:-1] for line in table.splitlines() if line.startswith("┃")]
            headers = [" ".join(part.strip() for part in column if part.strip()) for column in zip(*cells)]
            assert headers == ["layer", "dist", "uniform", "dist w/o 1st", "uniform w/o 1st", "1st mass",
                               "uniform 1st", "special", "sink rate"]  # fmt: skip
            assert max(len(line) for line in table.splitlines() if line[:1] in "┏┃┡│└") <= 80
        else:  # the title on one line
            assert any(line.startswith("Perplexity by window length — ") and line.rstrip().endswith(")")
                       for line in text.splitlines()), text  # fmt: skip
