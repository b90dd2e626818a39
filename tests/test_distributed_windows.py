"""`posprobe context` and `posprobe needle` data-parallel (SPEC §19): `torchrun --nproc-per-node 2` (gloo on CPU)
writes the same .npz as one process (windows / prompts shared out by rank, sums and per-prompt scores added over the
ranks), and a rank that fails on its own window or prompt ends the run with its one-line error and nothing written.
Default tier: `--max-memory` that sends every layer to disk (accelerate's big-model inference) gives the plain run's
arrays for profiles --text, fhat --text, rotary --text, context and needle, and is refused in one line without
--device auto; the global progress count; the merge of per-prompt scores, checked with a fake process group."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_context import tiny_llama
from test_distributed import _env, _run, _same_arrays
from test_needle import TASK_FLAGS, char_tokenizer, tiny_causal_lm
from tiny_tokenizer import causal_folder

import posprobe
from posprobe.runtime import distributed

SPIKE_WORD = 59  # "w59", token id 64 of the word tokenizer
SPIKE_CHAR = "Q"  # token id 51 of the character tokenizer
HAYSTACK = "The farmers brought grain to the mill. " * 3 + "Quiet rain fell on the hills all night. " * 6


def spiked(model, token: int):
    """`model` (a Llama causal LM) whose first layer's attention overflows to NaN at `token` alone: channel 0 of
    every embedding is 0 but `token`'s (which is e_0), and the first norm scales channel 0 by 1e30, so `token`'s
    query-key score with itself is past float32 (inf, then NaN in the softmax). Every weight is finite."""
    base = model.model
    with torch.no_grad():
        base.embed_tokens.weight[:, 0] = 0
        base.embed_tokens.weight[token] = 0
        base.embed_tokens.weight[token, 0] = 1
        base.layers[0].input_layernorm.weight[0] = 1e30
    return model


def context_folder(path, model):
    """A folder with a tiny Llama causal LM and a word tokenizer whose [CLS] is its BOS and [SEP] its EOS."""
    return causal_folder(path, model)


def needle_folder(path, model):
    char_tokenizer().save_pretrained(path)
    model.save_pretrained(path)
    (path / "haystack.txt").write_text(HAYSTACK + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("windows")
    context = context_folder(root / "context", tiny_llama())
    rng = np.random.default_rng(3)
    texts = context / "docs.txt"
    texts.write_text("".join(" ".join(f"w{x}" for x in rng.integers(0, 59, size=rng.integers(5, 40))) + "\n"
                             for _ in range(30)))  # fmt: skip
    return {"context": context, "texts": texts, "needle": needle_folder(root / "needle", tiny_causal_lm("llama"))}


def _context_args(folders) -> list[str]:
    return ["context", str(folders["context"]), "--text", str(folders["texts"]), "--lengths", "16,24",
            "--windows", "5", "--rope-scaling", "none,yarn:2", "--batch-size", "2"]  # fmt: skip


def _needle_args(folders) -> list[str]:
    folder = folders["needle"]
    return ["needle", str(folder), "--haystack", str(folder / "haystack.txt"), "--lengths", "60,100",
            "--depths", "0,0.5,1", "--trials", "2", *TASK_FLAGS]  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# default tier


def test_progress_counts_every_ranks_items(monkeypatch):
    """Rank 1 of 3 finishing items 1, 4, 7 of 8: the rounds of 3 beside them are done (3, 6, then all 8)."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert [distributed.done_by_all(k, 8) for k in (1, 4, 7)] == [3, 6, 8]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert [distributed.done_by_all(k, 4) for k in range(4)] == [1, 2, 3, 4]


def test_merged_prompt_scores_are_each_ranks_own(monkeypatch):
    """`needle._merge_ranks` with a fake two-rank all-reduce (the other rank's arrays added): every prompt's score
    comes back as the rank that ran it computed it (greedy ids of any length, NaN-free log-probabilities)."""
    from posprobe.pipelines import needle as N

    class Prompt:
        def __init__(self, answer_len):
            self.answer_ids = list(range(answer_len))

    prompts = [Prompt(3), Prompt(2), Prompt(3), Prompt(1)]
    scores = [N.PromptScore(-0.5 * k - 0.25, k % 2 == 0, list(range(k % 3 + 1)), np.full((2, 3), k / 7.0),
                            [-0.1 * (k + 1)] * len(prompts[k].answer_ids)) for k in range(4)]  # fmt: skip
    ranks = [{k: s for k, s in enumerate(scores) if k % 2 == r} for r in (0, 1)]
    calls = []
    monkeypatch.setattr(distributed, "all_reduce_sum", lambda a: calls.append(a) or a)
    N._merge_ranks(ranks[1], prompts, 2, 3)
    # log_prob, exact, greedy, token log-probs, attention, Wu's retrieval score: summed in this order on every rank
    assert len(calls) == 6
    sent = iter([a.copy() for a in calls])

    def fake_sum(array):  # what rank 1 sends (its sums in the same order), computed with the same function
        theirs = next(sent)
        assert theirs.shape == array.shape and theirs.dtype == array.dtype
        return array + theirs

    monkeypatch.setattr(distributed, "all_reduce_sum", fake_sum)
    merged = N._merge_ranks(ranks[0], prompts, 2, 3)
    for got, want in zip(merged, scores):
        assert got.log_prob == want.log_prob and got.exact == want.exact and got.greedy_ids == want.greedy_ids
        assert got.token_log_probs == want.token_log_probs
        np.testing.assert_array_equal(got.needle_attention, want.needle_attention)


# the default run keeps one command (rotary, the quickest); the slow tier (CI) runs the five
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(c, marks=() if c == "rotary" else pytest.mark.slow)
        for c in ("profiles", "fhat", "rotary", "context", "needle")
    ],
)
def test_max_memory_offloads_to_disk_and_equals_the_plain_run(folders, tmp_path, capsys, caplog, command):
    """`--device auto --max-memory cpu=20KB` (every layer to disk, loaded by accelerate's hooks as it runs) writes
    the same arrays as the plain run; --max-memory without --device auto, or malformed, is one line and exit 2,
    before any folder is made."""
    from posprobe.cli import main

    texts = folders["texts"]
    base, npz = {
        "profiles": (["profiles", str(folders["context"]), "--text", str(texts), "--max-length", "16",
                      "--positions", "8", "--min-texts", "4"], "profiles_data-conditioned.npz"),
        "fhat": (["fhat", str(folders["context"]), "--text", str(texts), "--max-length", "16", "--positions", "8",
                  "--layer", "1", "--input", "position-mean", "--min-texts", "4"], None),
        "rotary": (["rotary", str(folders["context"]), "--text", str(texts), "--max-length", "16"], "rotary.npz"),
        "context": (["context", str(folders["context"]), "--text", str(texts), "--lengths", "16,24", "--windows",
                     "2", "--rope-scaling", "none,linear:2"], "context.npz"),
        "needle": ([*_needle_args(folders), "--lengths", "60", "--depths", "0,1", "--trials", "1"], "needle.npz"),
    }[command]  # fmt: skip
    # accelerate's own word for the offload, kept from the loading's silence for this check (records only)
    caplog.set_level(logging.WARNING, logger="accelerate.big_modeling")
    for extra, out in (([], "plain"), (["--device", "auto", "--max-memory", "cpu=20KB"], "offloaded")):
        caplog.clear()
        main([*base, *extra, "--out", str(tmp_path / out), "--json"])  # returns on success
        assert ("offloaded to the disk" in caplog.text) == (out == "offloaded")  # accelerate's own word for it
    capsys.readouterr()
    if npz is None:  # fhat: a .json record (each head's R² of the position-mean matrices); the library's matrices
        (one,) = (tmp_path / "plain").glob("*.json")
        plain, offloaded = (json.loads((tmp_path / k / one.name).read_text()) for k in ("plain", "offloaded"))
        r2 = [[head["toeplitz_r2"] for head in record["heads"]] for record in (plain, offloaded)]
        assert None not in r2[0] and plain["conditioning"]["n_tokens"] == offloaded["conditioning"]["n_tokens"]
        np.testing.assert_allclose(r2[0], r2[1], rtol=1e-6)
        settings = dict(texts=texts.read_text().splitlines(), positions=8, input="position-mean", min_texts=4)
        a = posprobe.fhat(str(folders["context"]), 1, **settings)
        b = posprobe.fhat(str(folders["context"]), 1, device="auto", max_memory={"cpu": "20KB"}, **settings)
        np.testing.assert_allclose(a.matrices, b.matrices, rtol=1e-5, atol=1e-6)
    else:
        with np.load(tmp_path / "plain" / npz) as a, np.load(tmp_path / "offloaded" / npz) as b:
            assert a.files == b.files
            for name in a.files:
                if a[name].dtype.kind == "f":
                    np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-7, equal_nan=True, err_msg=name)
                else:
                    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
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


def test_a_non_finite_window_or_prompt_is_one_line(tmp_path, capsys):
    """In one process: the spiked models' NaN losses are refused in one line (exit 2, nothing written), naming the
    window / the prompt; the plain models run."""
    from posprobe.cli import main

    context = context_folder(tmp_path / "context", spiked(tiny_llama(), 5 + SPIKE_WORD))
    (context / "text.txt").write_text(" ".join(f"w{k}" for k in range(19)) + f" w{SPIKE_WORD}" + " w1" * 12 + "\n")
    needle = needle_folder(tmp_path / "needle", spiked(tiny_causal_lm("llama"), 2 + ord(SPIKE_CHAR) - 32))
    for args, words in (
        (["context", str(context), "--text", str(context / "text.txt"), "--lengths", "16", "--windows", "2"],
         "NaN or infinite losses on window 1 of 16 tokens"),
        (["needle", str(needle), "--haystack", str(needle / "haystack.txt"), "--lengths", "60,200", "--depths", "0",
          "--trials", "1", *TASK_FLAGS], "NaN or infinite log-probability on prompt 1"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            main([*args, "--out", str(tmp_path / "out")])
        assert exit_info.value.code == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("posprobe: error")]
        assert len(lines) == 1 and words in lines[0], lines
        assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------------
# slow tier: real torchrun processes


@pytest.mark.slow
@pytest.mark.parametrize("command", ["context", "needle"])
def test_two_ranks_equal_one_process(folders, tmp_path, command):
    """context: 2 variants x (6 batches of length 16 + 3 of 24), batch k on rank k % 2; needle: 12 prompts, 6 per
    rank. The .npz equals one process's (integers equal, floats to summation order), one JSON object on stdout
    (rank 0's), one set of files."""
    args, npz = {"context": (_context_args(folders), "context.npz"), "needle": (_needle_args(folders), "needle.npz")}[
        command
    ]
    records = {}
    for ranks in (1, 2):
        out = tmp_path / f"ranks{ranks}"
        proc = _run([*args, "--out", str(out), "--json"], ranks)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, proc.stdout
        records[ranks] = json.loads(lines[0])
        assert "posprobe: error" not in proc.stderr
    _same_arrays(tmp_path / "ranks1" / npz, tmp_path / "ranks2" / npz)
    names = [sorted(p.name for p in (tmp_path / f"ranks{r}").iterdir()) for r in (1, 2)]
    assert names[0] == names[1]
    if command == "needle":
        prompts = [(tmp_path / f"ranks{r}" / "prompts.jsonl").read_text().splitlines() for r in (1, 2)]
        assert [json.loads(x)["greedy_ids"] for x in prompts[0]] == [json.loads(x)["greedy_ids"] for x in prompts[1]]
        # one rank scored each prompt as one process does, and adding zeros is exact: the records are equal
        assert {k: v for k, v in records[1].items() if k != "files"} == {
            k: v for k, v in records[2].items() if k != "files"
        }
    else:
        assert records[1]["windows"] == records[2]["windows"] and records[1]["tokens"] == records[2]["tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["context", "needle"])
def test_a_failing_rank_ends_the_run_with_its_error_and_nothing_written(tmp_path, command):
    """Only rank 1's window (context: window 1 of 2) or prompt (needle: prompt 1 of 2, the only one long enough to
    reach the haystack's 'Q') holds the token whose attention overflows: rank 1 stops with its one-line error,
    torchrun stops rank 0 (waiting for the sums), the run exits non-zero, no file is written."""
    if command == "context":
        folder = context_folder(tmp_path / "model", spiked(tiny_llama(), 5 + SPIKE_WORD))
        (folder / "text.txt").write_text(" ".join(f"w{k}" for k in range(19)) + f" w{SPIKE_WORD}" + " w1" * 12 + "\n")
        args = ["context", str(folder), "--text", str(folder / "text.txt"), "--lengths", "16", "--windows", "2"]
        words = "NaN or infinite losses on window 1"
    else:
        folder = needle_folder(tmp_path / "model", spiked(tiny_causal_lm("llama"), 2 + ord(SPIKE_CHAR) - 32))
        args = ["needle", str(folder), "--haystack", str(folder / "haystack.txt"), "--lengths", "60,200",
                "--depths", "0", "--trials", "1", *TASK_FLAGS]  # fmt: skip
        words = "NaN or infinite log-probability on prompt 1"
    out = tmp_path / "out"
    proc = _run([*args, "--out", str(out), "--json"], 2)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("posprobe: error:")]
    (own,) = [line for line in errors if line.startswith("posprobe: error: rank 1:")]
    assert words in own, proc.stderr[-3000:]
    # rank 0, waiting in the all-reduce, either sees rank 1's connection close or is stopped by torchrun: one line
    # that says so, never an internal error
    for line in errors:
        assert (
            line == own
            or line.startswith("posprobe: error: rank 0: ")
            and ("another torchrun rank stopped" in line or "terminated (SIGTERM)" in line)
        ), proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(records) <= 1 and all(r["exit_code"] in (2, 143) for r in records)  # --json: from rank 0 alone
    assert not out.exists() or not any(out.iterdir())


_LIBRARY_SCRIPT = """
import sys, numpy as np, torch.distributed as dist
import posprobe
dist.init_process_group("gloo")
context_folder, texts, needle_folder, stem = sys.argv[1:]
lines = open(texts).read().splitlines()
c = posprobe.context(context_folder, [16, 24], texts=lines, windows=3, rope_scaling="none,linear:2")
task = posprobe.NeedleTask(intro="Find the key.\\n", needle=" The key is {answer}.", question="\\nThe key is")
n = posprobe.needle(needle_folder, haystack=needle_folder + "/haystack.txt", task=task,
                    grid=posprobe.NeedleGrid(lengths=[60, 100], depths=[0, 1], trials=2))
np.savez(f"{stem}-rank{dist.get_rank()}.npz", position_loss=c.position_loss, perplexity=c.perplexity,
         windows=c.windows, log_prob=n.log_prob, exact=n.exact, attention=n.needle_attention)
dist.barrier()  # every rank past its last collective before any tears gloo down
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_the_library_takes_the_same_path_in_a_process_group_the_caller_made(folders, tmp_path):
    """A script that initialises the process group itself and calls `posprobe.context` and `posprobe.needle`:
    every rank returns the result over all windows and prompts, equal to one process's."""
    script = tmp_path / "script.py"
    script.write_text(_LIBRARY_SCRIPT)
    args = [str(folders["context"]), str(folders["texts"]), str(folders["needle"])]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    proc = subprocess.run([*cmd, *args, str(tmp_path / "two")], env=_env(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = subprocess.run([sys.executable, str(script), *args, str(tmp_path / "one")],
                            env={**_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29534", "RANK": "0",
                                 "WORLD_SIZE": "1"}, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    for rank in (0, 1):
        _same_arrays(tmp_path / "one-rank0.npz", tmp_path / f"two-rank{rank}.npz")
