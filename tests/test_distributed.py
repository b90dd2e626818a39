"""Data-parallel capture (SPEC §19): `torchrun --nproc-per-node 2` (gloo on CPU) gives the same files as one process
for attention, states, rotary --text and profiles --text; a rank that fails ends the run with its one-line error
and nothing written. Default tier: the pieces without a process group (batch sharding and the global progress
count, the probe's re-centring, rank 0 alone writing, the rank in error lines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_attention import tiny_model
from tiny_tokenizer import word_tokenizer

from posprobe.analysis.empirical import EmpiricalAccumulator
from posprobe.analysis.position_probe import PositionProbeAccumulator
from posprobe.capture import run, textrun
from posprobe.capture.batches import id_tokenizer, token_batches
from posprobe.runtime import distributed

ROOT = Path(__file__).resolve().parents[1]
NAN_WORD = 59  # "w59": token id 63, whose embedding the failing-rank test sets to NaN


# ----------------------------------------------------------------------------------------------------
# default tier: no process group


class _Batches:
    """Records which batches a reducer saw."""

    needs = ("hidden_states",)
    rank_sums = ()

    def __init__(self):
        self.indices, self.texts = [], []

    def add(self, batch):
        self.indices.append(batch.index)
        self.texts += batch.text_ids.tolist()

    def result(self):
        return self.indices


def test_a_rank_runs_every_world_th_batch_and_progress_counts_every_rank(monkeypatch):
    """Rank 1 of 3 runs batches 1, 4, 7 (numbered among all batches) and its progress adds up to every text."""
    monkeypatch.setattr(distributed, "join_process_group", lambda device: True)
    monkeypatch.setattr(distributed, "rank_and_world", lambda: (1, 3))
    monkeypatch.setattr(distributed, "reduce_counts", lambda values, op="sum": list(values))
    model = tiny_model("llama")
    rows = [[5 + (t % 7)] * (1 + t % 5) for t in range(17)]  # 17 texts, batches of 2: 9 batches
    batches = token_batches(rows, id_tokenizer((), 16, 99), batch_size=2, pad_id=0)
    seen, done = _Batches(), []
    run.capture_batches(model, batches, [seen], progress=done.append)
    assert seen.indices == [1, 4, 7]
    assert sum(done) == 17  # the other ranks' batches are counted as this rank passes them
    assert done[:4] == [2, 2, 4, 2]  # batch 0 (rank 0), batch 1 (its own), batches 2-3, batch 4
    everyone = [b.text_ids.tolist() for b in token_batches(rows, id_tokenizer((), 16, 99), batch_size=2, pad_id=0)]
    assert seen.texts == everyone[1] + everyone[4] + everyone[7]


def test_a_reducer_without_rank_sums_is_refused_before_any_batch(monkeypatch):
    monkeypatch.setattr(distributed, "join_process_group", lambda device: True)

    class NoSums:
        needs = ("hidden_states",)

        def add(self, batch):
            raise AssertionError("ran a batch")

    with pytest.raises(Exception, match="cannot be combined over torchrun ranks"):
        run.capture_batches(tiny_model("llama"), [], [NoSums()])


def test_probe_sums_recentred_on_another_shift_equal_sums_taken_with_it():
    """Sums taken with the first batch's shift, re-centred on another rank's shift, equal sums taken with that
    shift from the start (the merge of SPEC §19 adds sums that share one shift)."""
    torch.manual_seed(3)
    model = tiny_model("bert")
    rows = [list(np.random.default_rng(t).integers(5, 90, size=3 + t % 6)) for t in range(12)]
    first, second = PositionProbeAccumulator(3, [0, 2], 32), PositionProbeAccumulator(3, [0, 2], 32)
    second.shift = torch.randn(2, 32, dtype=torch.float64)  # another rank's shift
    for acc in (first, second):
        textrun.capture(model, [acc], input_ids=rows, max_length=16, batch_size=4)
    assert not torch.allclose(first.shift, second.shift)
    gram_before = first.gram.clone()
    first.recentre(second.shift)
    assert not torch.allclose(gram_before, first.gram)
    for name in ("gram", "first", "cross", "count", "ysum", "ysq"):
        torch.testing.assert_close(getattr(first, name), getattr(second, name), rtol=1e-10, atol=1e-9)


def test_only_rank_zero_writes_once_a_capture_ran_data_parallel(monkeypatch, tmp_path):
    from posprobe.formats import writing as outputs

    monkeypatch.setattr(distributed, "rank_and_world", lambda: (1, 2))
    monkeypatch.setattr(distributed, "_DATA_PARALLEL", [True])
    paths = outputs.write_files(tmp_path / "out", {"a.txt": lambda p: p.write_text("a")})
    assert paths == {"a.txt": tmp_path / "out" / "a.txt"} and not (tmp_path / "out").exists()
    assert outputs.prepare_out_dir(tmp_path / "other") == tmp_path / "other" and not (tmp_path / "other").exists()
    monkeypatch.setattr(distributed, "rank_and_world", lambda: (0, 2))
    outputs.write_files(tmp_path / "out", {"a.txt": lambda p: p.write_text("a")})
    assert (tmp_path / "out" / "a.txt").read_text() == "a"


def test_error_lines_name_the_rank_under_torchrun(monkeypatch):
    from posprobe.cli.console import rank_prefix

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert distributed.env_rank_and_world() == (1, 2) and not distributed.is_main_process()
    assert rank_prefix() == "rank 1: "
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert rank_prefix() == "" and distributed.is_main_process()


def test_a_batch_that_cannot_fit_is_refused_in_one_line_before_it_runs(monkeypatch, tmp_path, capsys):
    """The estimate from the shapes against the free memory: exit 2, one line, no folder; the estimate itself is
    the counted tensors times the calibration."""
    from posprobe.capture import memory
    from posprobe.cli import main

    assert memory.attention_batch_bytes(2, 4, 3, 100, 4, True, True) == int(
        memory.CALIBRATION * (2 * 3 * 4 * 100**2 * 4 * 2 + 2 * 3 * 4 * 100**2 * 4 + 2 * 3 * 100**2 + 2 * 4 * 100**2 * 8)
    )
    folder = tmp_path / "llama"
    word_tokenizer(60).save_pretrained(folder)
    tiny_model("llama").save_pretrained(folder)
    texts = tmp_path / "texts.txt"
    texts.write_text(" ".join(f"w{i}" for i in range(14)) + "\nw4 w5\n")  # 16 tokens with [CLS] and [SEP]
    monkeypatch.setattr(run, "_CHECKED_FROM", 0)
    accumulators = EmpiricalAccumulator.nbytes(2, 4, 16)
    batch = memory.attention_batch_bytes(2, 4, 2, 16, 4, True, True)
    assert accumulators < batch
    out = tmp_path / "out"
    args = ["attention", str(folder), "--text", str(texts), "--max-length", "16", "--out", str(out)]
    for free, what, hint in ((accumulators - 1, "accumulators", "--max-length"), (batch - 1, "batch", "--batch-size")):
        monkeypatch.setattr(memory, "available_bytes", lambda device, free=free: free)
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("posprobe: error")]
        assert len(lines) == 1 and what in lines[0] and "estimated from the shapes" in lines[0], lines
        assert hint in lines[0]
    assert not out.exists()


def test_every_reducer_of_the_text_commands_lists_every_array_it_keeps(monkeypatch):
    """`check_mergeable` on each reducer after a batch (lazily sized sums exist then): an array kept by a reducer
    but combined by no rule would hold one rank's texts only. A reducer with a forgotten sum is refused."""
    from posprobe.analysis.hidden_means import HiddenMeanAccumulator
    from posprobe.analysis.massive import MassiveActivationAccumulator
    from posprobe.analysis.positional_vectors import PermutedPositionAccumulator, PositionalVectorAccumulator
    from posprobe.analysis.sinks import SinkAccumulator

    model = tiny_model("llama")
    reducers = [
        EmpiricalAccumulator(2, 4, 16),
        SinkAccumulator(2, 4),
        HiddenMeanAccumulator([0, 1], "position-mean", 16),
        PositionalVectorAccumulator(3, 16, 32),
        PermutedPositionAccumulator(3, 16, 32, draws=2),
        PositionProbeAccumulator(3, [0, 2], 32),
        MassiveActivationAccumulator(3),
    ]
    textrun.capture(model, reducers, input_ids=[[5, 6, 7, 8], [9, 10]], max_length=16)
    distributed.check_mergeable(reducers)
    reducers[0].forgotten = torch.zeros(3)
    with pytest.raises(Exception, match="forgotten is not combined"):
        distributed.check_mergeable(reducers)


def test_a_plain_run_is_not_data_parallel():
    assert distributed.join_process_group("cpu") is False
    assert distributed.mine(0) and distributed.mine(5)  # world size 1: every batch
    assert distributed.mine(0) and not distributed.skips_writes()


# ----------------------------------------------------------------------------------------------------
# slow tier: real torchrun processes


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A tiny rotary Llama with an offline word tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    word_tokenizer(60).save_pretrained(folder)
    tiny_model("llama").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    rng = np.random.default_rng(7)
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    rows = [" ".join(f"w{x}" for x in rng.integers(0, NAN_WORD, size=rng.integers(1, 14))) for _ in range(23)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def _run(args: list[str], ranks: int) -> subprocess.CompletedProcess:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"] if ranks > 1 else []
    cmd = [sys.executable, *launcher, "-m", "posprobe", *args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)


def _same_arrays(one: Path, two: Path) -> None:
    """Integers (and NaN places) equal, floats equal up to float64 summation order (atol 1e-9: states' noise floor
    is the square root of a variance that cancels to round-off where every text has the same token, [CLS] at
    position 0: 3e-10 in one process, 0.0 in two)."""
    with np.load(one) as a, np.load(two) as b:
        assert a.files == b.files
        for name in a.files:
            x, y = a[name], b[name]
            if x.dtype.kind == "f":
                np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-9, equal_nan=True, err_msg=name)
            elif name == "metadata":  # a JSON object: its floats (the probe's baseline MAE) to the same summation order
                _same_json(json.loads(str(x)), json.loads(str(y)), name)
            else:
                np.testing.assert_array_equal(x, y, err_msg=name)


def _same_json(x, y, where: str) -> None:
    """Two parsed JSON values equal: keys, strings, integers and booleans exactly, floats to 1e-9 (`_same_arrays`)."""
    assert type(x) is type(y) or {type(x), type(y)} <= {int, float}, (where, x, y)
    if isinstance(x, dict):
        assert list(x) == list(y), where
        for key in x:
            _same_json(x[key], y[key], f"{where}.{key}")
    elif isinstance(x, list):
        assert len(x) == len(y), where
        for index, (a, b) in enumerate(zip(x, y)):
            _same_json(a, b, f"{where}[{index}]")
    elif isinstance(x, float) or isinstance(y, float):
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-9, err_msg=where)
    else:
        assert x == y, (where, x, y)


COMMANDS = {
    "attention": (["attention"], "attention.npz"),
    "states": (["states"], "states.npz"),
    "rotary": (["rotary"], "rotary.npz"),
    "profiles": (["profiles", "--positions", "16"], "profiles_data-conditioned.npz"),
}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_two_ranks_equal_one_process(llama_folder, texts, tmp_path, command):
    """Batches of 3 texts: the 2 ranks run 4 batches each of 8; every array of the .npz equals one process's,
    one JSON object on stdout (rank 0's), one set of files."""
    head, npz = COMMANDS[command]
    records = {}
    for ranks in (1, 2):
        out = tmp_path / f"ranks{ranks}"
        args = [*head, str(llama_folder), "--text", str(texts), "--max-length", "16", "--batch-size", "3"]
        proc = _run([*args, "--out", str(out), "--json"], ranks)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, proc.stdout
        records[ranks] = json.loads(lines[0])
        assert "posprobe: error" not in proc.stderr
    _same_arrays(tmp_path / "ranks1" / npz, tmp_path / "ranks2" / npz)
    assert sorted(p.name for p in (tmp_path / "ranks1").iterdir()) == sorted(
        p.name for p in (tmp_path / "ranks2").iterdir()
    )
    for key in ("n_texts", "n_tokens", "n_pairs", "n_queries"):
        if key in records[1]:
            assert records[1][key] == records[2][key], key


@pytest.mark.slow
def test_a_failing_rank_ends_the_run_with_its_error_and_nothing_written(llama_folder, tmp_path):
    """Only the text that goes to batch 1 (rank 1) holds the word whose embedding is NaN: rank 1 stops with its
    one-line error, torchrun stops rank 0 (waiting for the sums), the run exits non-zero, no folder is left."""
    from transformers import LlamaModel

    folder = tmp_path / "nan-llama"
    model = LlamaModel.from_pretrained(llama_folder)
    with torch.no_grad():
        model.embed_tokens.weight[5 + NAN_WORD, 0] = float("nan")
    model.save_pretrained(folder)
    word_tokenizer(60).save_pretrained(folder)
    # batch size 1, sorted by length (longest first): the second-longest text is batch 1, rank 1's
    rows = ["w1 w2 w3 w4 w5 w6", f"w1 w2 w{NAN_WORD} w4 w5", "w1 w2 w3 w4", "w1 w2 w3"]
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    proc = _run(["states", str(folder), "--text", str(path), "--max-length", "16", "--batch-size", "1",
                 "--min-texts", "1", "--out", str(out), "--json"], 2)  # fmt: skip
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("posprobe: error: rank 1:")]
    assert len(errors) == 1 and "NaN or infinite" in errors[0], proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(records) == 1 and records[0]["exit_code"] == 2  # --json: rank 0 alone prints the error object
    assert not out.exists() or not any(out.iterdir())


# ----------------------------------------------------------------------------------------------------
# models larger than memory: accelerate's big-model inference


def test_a_model_offloaded_to_disk_gives_the_plain_models_results(tmp_path):
    """A tiny Llama loaded with device_map='auto' and a max_memory that sends its layers to disk (accelerate's
    hooks load each layer's weights as it runs) gives the same attention statistics and hidden-state analyses as
    the model loaded plainly."""
    import posprobe
    from posprobe.retrofitting.loading import load_model

    folder = tmp_path / "llama"
    tiny_model("llama").save_pretrained(folder)
    offloaded = load_model(
        str(folder), device_map="auto", max_memory={"cpu": "20KB"}, offload_folder=str(tmp_path / "offload")
    )
    assert "disk" in set(offloaded.hf_device_map.values())
    assert any(p.device.type == "meta" for p in offloaded.parameters())  # weights not in memory
    plain = load_model(str(folder))
    ids = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23]]
    settings = dict(input_ids=ids, max_length=16, batch_size=2, weights_correlation=False)
    a, b = posprobe.attention_profiles(offloaded, **settings), posprobe.attention_profiles(plain, **settings)
    for name in ("score_profiles", "prob_profiles", "mean_distance", "mean_scores", "count_matrix"):
        np.testing.assert_allclose(getattr(a.profiles, name), getattr(b.profiles, name), rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(a.sinks.first_token_mass, b.sinks.first_token_mass, rtol=1e-6)
    s1 = posprobe.states(offloaded, input_ids=ids, max_length=16, min_texts=1)
    s2 = posprobe.states(plain, input_ids=ids, max_length=16, min_texts=1)
    np.testing.assert_allclose(s1.vectors.norms, s2.vectors.norms, rtol=1e-5, equal_nan=True)


@pytest.mark.slow  # every layer read from disk (test_distributed_windows.py keeps one such run in the default tier)
def test_cli_device_auto_with_max_memory_offloads_to_disk_and_equals_the_plain_run(tmp_path, capsys):
    """`attention --device auto --max-memory cpu=20KB` (every layer to disk) writes the same arrays as the plain
    run; --max-memory without --device auto, or malformed, is one line and exit 2."""
    from posprobe.cli import main

    folder = tmp_path / "llama"
    word_tokenizer(60).save_pretrained(folder)
    tiny_model("llama").save_pretrained(folder)
    texts = tmp_path / "texts.txt"
    texts.write_text("w1 w2 w3 w4 w5\nw6 w7\nw8 w9 w10\n")
    base = ["attention", str(folder), "--text", str(texts), "--max-length", "16", "--batch-size", "2"]
    for extra, out in (([], "plain"), (["--device", "auto", "--max-memory", "cpu=20KB"], "offloaded")):
        main([*base, *extra, "--out", str(tmp_path / out), "--json"])  # returns on success
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["n_texts"] == 3
    with np.load(tmp_path / "plain" / "attention.npz") as a, np.load(tmp_path / "offloaded" / "attention.npz") as b:
        for name in ("score_profiles", "prob_profiles", "mean_distance", "count_matrix", "first_token_mass"):
            np.testing.assert_allclose(a[name], b[name], rtol=1e-6, equal_nan=True, err_msg=name)
    for extra, message in (
        (["--max-memory", "cpu=1GiB"], "--max-memory applies only with --device auto"),
        (["--device", "auto", "--max-memory", "lots"], "DEVICE=SIZE"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main([*base, *extra, "--out", str(tmp_path / "bad")])
        assert exit_info.value.code == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("posprobe: error")]
        assert len(lines) == 1 and message in lines[0], lines
        assert not (tmp_path / "bad").exists()


_LIBRARY_SCRIPT = """
import sys, numpy as np, torch.distributed as dist
import posprobe
dist.init_process_group("gloo")
ids = [[5 + (7 * t + i) % 60 for i in range(2 + t % 9)] for t in range(13)]
result = posprobe.attention_profiles(sys.argv[1], input_ids=ids, max_length=16, batch_size=2,
                                     weights_correlation=False)
np.savez(f"{sys.argv[2]}-rank{dist.get_rank()}.npz", score=result.profiles.score_profiles,
         prob=result.profiles.prob_profiles, count=result.profiles.count_matrix, n=result.n_texts,
         first=result.sinks.first_token_mass)
dist.barrier()  # every rank past its last collective before any tears gloo down
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_the_library_takes_the_same_path_in_a_process_group_the_caller_made(llama_folder, tmp_path):
    """A script that initialises the process group itself and calls `attention_profiles`: every rank returns the
    result over all texts, equal to one process."""
    script = tmp_path / "script.py"
    script.write_text(_LIBRARY_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    proc = subprocess.run([*cmd, str(llama_folder), str(tmp_path / "two")], env=_env(), capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = subprocess.run([sys.executable, str(script), str(llama_folder), str(tmp_path / "one")],
                            env={**_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533", "RANK": "0",
                                 "WORLD_SIZE": "1"}, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    with np.load(tmp_path / "one-rank0.npz") as one:
        for rank in (0, 1):
            with np.load(tmp_path / f"two-rank{rank}.npz") as two:
                assert int(two["n"]) == int(one["n"]) == 13
                np.testing.assert_array_equal(two["count"], one["count"])
                for name in ("score", "prob", "first"):
                    np.testing.assert_allclose(two[name], one[name], rtol=1e-9, atol=1e-12, equal_nan=True)
