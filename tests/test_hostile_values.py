"""Hostile values to the newer paths (issue 48): option values checked before any weight is read, unknown rope types
in a config, a full disk under `report --force`, logits that do not fit in memory in `context`, and library logging
under `--device auto`.

Each bad value is one `posprobe: error: <what> — <what to do>` line, exit 2, nothing on stdout; the checks that
must come before loading run with the loader replaced by one that fails the test. The full disk is a real one: a
private tmpfs mounted in a mount namespace of its own (`unshare -m`, root only; skipped elsewhere).
"""

# ruff: noqa: F811 - the fixtures imported from test_attention and test_hostile are parameters of the tests below
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_attention import texts_file, tiny_bert_folder, tiny_model  # noqa: F401 - fixtures
from test_hostile import assert_one_line_error, run_cli, tiny_llama_folder  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[1]


def child_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "POSPROBE_CACHE_DIR": "off"}


@pytest.fixture
def no_loading(monkeypatch):
    """Every way a command loads weights fails the test (a refusal must come first)."""

    def loaded(*args, **kwargs):
        raise AssertionError("weights were read before the refusal")

    import posprobe.checkpoint.loading as loading
    import posprobe.retrofitting.loading as retrofit_loading

    monkeypatch.setattr(retrofit_loading, "load_model", loaded)
    monkeypatch.setattr(loading, "build_model", loaded)


@pytest.fixture(scope="module")
def causal_llama_folder(tiny_bert_folder, tmp_path_factory):
    """A tiny Llama causal LM (64 positions) with the tiny BERT's WordPiece tokenizer."""
    import torch
    import transformers as tf

    folder = tmp_path_factory.mktemp("causal-llama")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_bert_folder / name, folder / name)
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    tf.LlamaForCausalLM(config).eval().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def long_text(tmp_path_factory):
    """400 lines of the tiny tokenizer's words (enough windows of 32 tokens)."""
    path = tmp_path_factory.mktemp("long") / "long.txt"
    path.write_text("".join(" ".join(f"w{(i * 7 + j) % 60}" for j in range(40)) + "\n" for i in range(400)))
    return path


# each command that reads a model, with the arguments it needs besides the model
COMMANDS = {
    "attention": ["--text", "{texts}", "--column", "sentence"],
    "states": ["--text", "{texts}", "--column", "sentence"],
    "rotary": ["--text", "{texts}", "--column", "sentence"],
    "context": ["--text", "{long}", "--lengths", "32", "--windows", "2"],
    "needle": ["--lengths", "130", "--beyond-window"],
}


def command_args(command: str, model, texts_file, long_text, tmp_path) -> list:
    extra = [str(a).format(texts=texts_file, long=long_text) for a in COMMANDS[command]]
    return [command, model, *extra, "--out", tmp_path / "out"]


# -- A. --max-memory sizes --------------------------------------------------------------------------------------------
BAD_SIZES = {
    "cpu=12XB": "not a number of bytes",
    "cpu=-1GiB": "not positive",
    "cpu=1e999GiB": "more than any machine",
    "cpu=1e300GiB": "more than any machine",
    "cpu=0": "not positive",
    "cpu=0GiB": "not positive",
    "cpu=0.1B": "not positive",
    "cpu=nan": "not a number of bytes",
    "cpu=nanGiB": "not a number of bytes",
    "cpu=infGiB": "not a number of bytes",
    "cpu=GiB": "not a number of bytes",
    "cpu=2GiB,cpu=1GiB": "names cpu twice",
    "gpu=2GiB": "not cpu or a GPU index",
}


@pytest.mark.parametrize("value", list(BAD_SIZES))
def test_bad_max_memory_sizes_are_refused_in_the_parser(value):
    """accelerate read the sizes after the model had loaded (about 9 s in), blamed the checkpoint, and 1e999 gave an
    OverflowError: the parser checks each size itself."""
    from posprobe.capture.model import parse_max_memory
    from posprobe.errors import ArgumentValueError

    with pytest.raises(ArgumentValueError) as info:
        parse_max_memory(value)
    line = info.value.render(cli=True)
    assert "--max-memory" in line and BAD_SIZES[value] in line and "checkpoint" not in line, line


def test_good_max_memory_sizes_become_bytes():
    """The neighbours of the bad values, as accelerate would read them (units of bytes, any case, a space)."""
    from posprobe.capture.model import MAX_MEMORY_BYTES, parse_max_memory
    from posprobe.errors import ArgumentValueError

    assert parse_max_memory("cpu=1") == {"cpu": 1}
    assert parse_max_memory("cpu=1.5GB, 0=2GiB") == {"cpu": 1_500_000_000, 0: 2 * 2**30}
    assert parse_max_memory("cpu=8gib,mps=500 MB") == {"cpu": 8 * 2**30, "mps": 500_000_000}
    assert parse_max_memory({"cpu": "20KB"}) == {"cpu": 20_000}
    assert parse_max_memory(f"cpu={MAX_MEMORY_BYTES}") == {"cpu": MAX_MEMORY_BYTES}
    with pytest.raises(ArgumentValueError):
        parse_max_memory(f"cpu={MAX_MEMORY_BYTES + 1}")


@pytest.mark.parametrize("command", ["attention", "context", "needle", "rotary"])
def test_bad_max_memory_is_one_line_before_loading(
    command, causal_llama_folder, texts_file, long_text, no_loading, tmp_path, capsys
):
    args = command_args(command, causal_llama_folder, texts_file, long_text, tmp_path)
    code, out, err = run_cli([*args, "--device", "auto", "--max-memory", "cpu=1e999GiB"], capsys)
    assert_one_line_error(code, out, err, "--max-memory", "1e999GiB")
    assert not (tmp_path / "out").exists()


# -- B. unknown rope types -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def warp9_folder(causal_llama_folder, tmp_path_factory):
    """The tiny causal Llama with rope_type 'warp9' in its config.json."""
    folder = tmp_path_factory.mktemp("warp9")
    for item in causal_llama_folder.iterdir():
        shutil.copy(item, folder / item.name)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {**config["rope_parameters"], "rope_type": "warp9"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("command", ["rotary", "report", "context", "needle", "attention", "profiles", "fhat"])
def test_unknown_rope_type_is_one_line_naming_it(
    command, warp9_folder, texts_file, long_text, no_loading, tmp_path, capsys
):
    """rotary and report ended in `internal error: KeyError: 'warp9'`, context and needle blamed the checkpoint, and
    all leaked transformers' "Missing validation function" line."""
    if command in COMMANDS:
        args = command_args(command, warp9_folder, texts_file, long_text, tmp_path)
    else:
        args = [command, warp9_folder, "--out", tmp_path / "out"]
    code, out, err = run_cli(args, capsys)
    line = assert_one_line_error(code, out, err, "'warp9'", "known: ", "yarn", "llama3")
    assert "Missing validation" not in err, line
    assert not (tmp_path / "out").exists()


def test_known_rope_types_are_transformers_own():
    """Every rope type transformers builds a module for is known (a new one in a newer version too)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from posprobe.architectures.config import check_rope_types, known_rope_types

    assert {"default", *ROPE_INIT_FUNCTIONS} <= set(known_rope_types())
    for kind in known_rope_types():  # flat, per layer type, legacy rope_scaling with "type", a wrapper's text_config
        check_rope_types({"rope_parameters": {"rope_type": kind, "rope_theta": 1e4}}, "m")
        check_rope_types({"rope_parameters": {"full_attention": {"rope_type": kind}, "sliding_attention": None}}, "m")
        check_rope_types({"rope_scaling": {"type": kind, "factor": 2.0}}, "m")
    from posprobe.errors import PosprobeError

    for config in (
        {"rope_parameters": {"sliding_attention": {"rope_type": "default"}, "full_attention": {"rope_type": "x"}}},
        {"text_config": {"rope_scaling": {"type": "x", "factor": 2.0}}},
    ):
        with pytest.raises(PosprobeError, match="rope_type 'x'"):
            check_rope_types(config, "m")


# -- C. devices that cannot run, rope factors, needle answers, texts that are not files ----------------------------
# the default run: meta and an unknown name for every command; the slow tier (CI) adds hpu and cuda:7
@pytest.mark.parametrize("device", ["meta", pytest.param("hpu", marks=pytest.mark.slow),
                                    pytest.param("cuda:7", marks=pytest.mark.slow), "nonsense"])  # fmt: skip
@pytest.mark.parametrize("command", ["attention", "context", "needle", "rotary", "states"])
def test_a_device_that_cannot_run_is_refused_before_loading(
    command, device, causal_llama_folder, texts_file, long_text, no_loading, tmp_path, capsys
):
    """--device meta ended in an internal error after the model had loaded."""
    if device == "cuda:7":
        import torch

        if torch.cuda.device_count() > 7:
            pytest.skip("this machine has a GPU 7")
    args = command_args(command, causal_llama_folder, texts_file, long_text, tmp_path)
    code, out, err = run_cli([*args, "--device", device], capsys)
    assert_one_line_error(code, out, err, f"--device {device}" if device != "nonsense" else "unknown --device")


@pytest.mark.parametrize("factor", ["1e308", "1e7", "inf", "nan", "0.5", "-2"])
def test_rope_scaling_factor_is_bounded(factor):
    """linear:1e308 exited 0 with Infinity in the JSON and a numpy warning on stderr."""
    from posprobe.errors import ArgumentValueError
    from posprobe.families.rope_variants import MAX_FACTOR, parse_variants

    with pytest.raises(ArgumentValueError, match="needs a factor from 1 to"):
        parse_variants(f"linear:{factor}")
    assert parse_variants(f"yarn:{MAX_FACTOR:g}")[0].factor == MAX_FACTOR


def test_rope_scaling_largest_factor_gives_standard_json(causal_llama_folder, tmp_path, capsys):
    """The largest factor allowed runs and prints finite, standard JSON, with nothing on stderr."""
    from posprobe.families.rope_variants import MAX_FACTOR

    args = ["rotary", causal_llama_folder, "--rope-scaling", f"none,linear:{MAX_FACTOR:g},yarn:{MAX_FACTOR:g}"]
    code, out, err = run_cli([*args, "--out", tmp_path / "out", "--json"], capsys)
    assert code == 0 and err == "", err
    record = json.loads(out, parse_constant=lambda word: pytest.fail(f"{word} in the JSON"))
    assert len(record["budget"]["variants"]) == 3


def test_json_on_stdout_has_no_nan_or_infinity(capsys):
    """One JSON object with standard values only: a non-finite float is null, wherever it sits."""
    from posprobe.cli.console import emit_json

    emit_json({"a": float("inf"), "b": [np.float64("nan"), 1.5], "c": np.array([1.0, -np.inf]), "d": (2, np.nan)})
    out = capsys.readouterr().out
    assert json.loads(out, parse_constant=lambda word: pytest.fail(word)) == {
        "a": None, "b": [None, 1.5], "c": [1.0, None], "d": [2, None],
    }  # fmt: skip


def test_needle_answer_that_does_not_survive_the_tokenizer_is_refused(causal_llama_folder, tmp_path, capsys):
    """An answer the tokenizer maps to its unknown token was scored as '[UNK]': the prompt is refused first."""
    args = ["needle", causal_llama_folder, "--lengths", "130", "--beyond-window", "--out", tmp_path / "out"]
    code, out, err = run_cli([*args, "--answer", "☃☃☃"], capsys)
    assert_one_line_error(code, out, err, "'☃☃☃'", "does not survive", "[UNK]")
    code, out, err = run_cli([*args, "--answer", "w5", "--json"], capsys)  # a word it knows runs
    assert code == 0, err
    assert json.loads(out)["answers"] == ["w5"] if "answers" in json.loads(out) else True


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_text_that_is_not_a_file_is_described(kind, causal_llama_folder, tmp_path, capsys):
    """A FIFO given as --text was reported as 'does not exist'."""
    path = {"fifo": tmp_path / "pipe", "folder": tmp_path, "device": Path("/dev/null")}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    words = {"fifo": "named pipe (FIFO)", "folder": "is a folder", "device": "character device"}[kind]
    code, out, err = run_cli(["attention", causal_llama_folder, "--text", path, "--out", tmp_path / "out"], capsys)
    assert_one_line_error(code, out, err, words)
    assert "does not exist" not in err


# -- D. report on a full disk ---------------------------------------------------------------------------------------
FULL_DISK = r"""
set -u
mount -t tmpfs -o size=4m tmpfs "$MNT" || exit 77
report() { "$PYTHON" -m posprobe report "$MODEL" --only attention "$@" --out "$MNT/rep"; }
report > /dev/null 2> "$MNT/../good.err" || { echo "good report failed"; cat "$MNT/../good.err"; exit 3; }
sha256sum "$MNT/rep/report.html" > "$MNT/../before"
# leave 200 KiB: room for a new page (about 70 KiB), not for the section's arrays and figures (about 430 KiB)
free=$(df --output=avail -B1 "$MNT" | tail -1)
dd if=/dev/zero of="$MNT/filler" bs=4096 count=$(( (free - 200 * 1024) / 4096 )) 2> /dev/null
report --force --json > "$MNT/../full.out" 2> "$MNT/../full.err"
echo $? > "$MNT/../full.code"
sha256sum "$MNT/rep/report.html" > "$MNT/../after"
find "$MNT/rep" -type d -empty > "$MNT/../empty"
"""


@pytest.mark.slow
def test_report_on_a_full_disk_keeps_the_previous_page(causal_llama_folder, tmp_path):
    """A real full disk (a 4 MiB tmpfs, filled after a good report up to 200 KiB): `report --force` recorded the
    attention section as 'failed' (its arrays did not fit), exited 0 and replaced the good report.html with a page
    of the failure. Now: exit 2, one line, the page intact, no empty folder."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a private tmpfs needs root and unshare")
    mount = tmp_path / "mnt"
    mount.mkdir()
    env = {**child_env(), "MNT": str(mount), "PYTHON": sys.executable, "MODEL": str(causal_llama_folder)}
    done = subprocess.run(["unshare", "-m", "bash", "-c", FULL_DISK], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    if done.returncode == 77:
        pytest.skip("tmpfs cannot be mounted here")
    assert done.returncode == 0, done.stdout + done.stderr
    read = lambda name: (tmp_path / name).read_text()  # noqa: E731
    code, err = int(read("full.code")), read("full.err").splitlines()
    assert code == 2, read("full.err")
    assert err[-1].startswith("posprobe: error: ") and "No space left on device" in err[-1], err
    assert json.loads(read("full.out").splitlines()[-1])["exit_code"] == 2
    assert read("before").split()[0] == read("after").split()[0]  # the previous page, byte for byte
    assert read("empty") == ""


def test_a_failed_section_leaves_no_empty_folder(causal_llama_folder, tmp_path, monkeypatch, capsys):
    """A section whose command refuses the model is 'failed' and its folder, created for it, goes."""
    from posprobe.errors import PosprobeError
    from posprobe.pipelines import weights

    def refuse(*args, **kwargs):  # called once the command has made its --out folder
        raise PosprobeError("refused for the test")

    monkeypatch.setattr(weights, "profiles", refuse)
    code, out, err = run_cli(["report", causal_llama_folder, "--only", "profiles", "--out", tmp_path / "rep"], capsys)
    assert code == 0 and "profiles: failed — refused for the test" in err, err
    assert (tmp_path / "rep" / "report.html").is_file() and not (tmp_path / "rep" / "profiles").exists()


# -- E. context's logits in blocks ------------------------------------------------------------------------------------
def _causal_lms():
    import torch
    import transformers as tf

    small = dict(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    return {
        "llama": tf.LlamaForCausalLM(tf.LlamaConfig(**small)),
        "gemma2 (soft-capped logits)": tf.Gemma2ForCausalLM(
            tf.Gemma2Config(**small, head_dim=8, final_logit_softcapping=3.0)
        ),
        "granite (scaled logits)": tf.GraniteForCausalLM(tf.GraniteConfig(**small, logits_scaling=4.0)),
        "gpt2": tf.GPT2LMHeadModel(
            tf.GPT2Config(vocab_size=99, n_positions=64, n_embd=32, n_head=4, n_layer=2, bos_token_id=0, eos_token_id=0)
        ),
    }


def test_blocked_loss_is_the_plain_loss_to_float32_round_off():
    """The loss block by block of positions equals the loss of the plain forward pass (the LM's own code after its
    decoder runs on each block), for every block size, to the float32 logits' round-off: the output projection of a
    block of rows is a matrix product of another shape, which the CPU's BLAS may sum in another order (on an AVX2
    machine blocks of 1-3 positions differ by up to 5e-7 nats; on others they were bit-identical). Sizes whose
    logits fit run the plain pass itself: bit for bit."""
    import torch

    from posprobe.analysis.context_loss import token_nll
    from posprobe.capture.logit_blocks import window_loss

    ids = np.random.default_rng(0).integers(0, 99, size=(3, 40))
    for name, net in _causal_lms().items():
        net.eval()
        with torch.inference_mode():
            plain = token_nll(net(input_ids=torch.as_tensor(ids), use_cache=False).logits, torch.as_tensor(ids))
        assert np.array_equal(window_loss(net, ids, "cpu"), plain), name
        for positions in (1, 7, 38, 39):
            blocked = window_loss(net, ids, "cpu", budget=4 * 3 * 99 * positions)
            # float32 logits of magnitude ~10: a few units in their last place, far below any reading (1e-4 nats)
            np.testing.assert_allclose(blocked, plain, rtol=0, atol=2e-6, err_msg=f"{name}, {positions}")


def test_block_positions_keep_the_logits_within_the_budget():
    from posprobe.capture.logit_blocks import LOGIT_BLOCK_BYTES, block_positions

    assert block_positions(1, 32767, 262144) == LOGIT_BLOCK_BYTES // (4 * 262144) == 256
    assert block_positions(1, 2047, 49152) == 1365  # SmolLM2 at 2048 tokens: 2 blocks
    assert block_positions(1, 127, 49152) == 127  # one block: the plain pass
    assert block_positions(64, 10, 10**9) == 1


def test_context_that_cannot_fit_is_refused_before_loading(causal_llama_folder, long_text, no_loading, monkeypatch,
                                                            tmp_path, capsys):  # fmt: skip
    import posprobe.capture.memory as memory

    monkeypatch.setattr(memory, "available_bytes", lambda device: 10_000)
    args = ["context", causal_llama_folder, "--text", long_text, "--lengths", "32", "--windows", "2"]
    code, out, err = run_cli([*args, "--batch-size", "2", "--out", tmp_path / "out"], capsys)
    assert_one_line_error(code, out, err, "does not fit in memory", "--batch-size")
    assert not (tmp_path / "out").exists()


BIG_VOCAB = r"""
import resource, sys, numpy as np, torch, transformers as tf
import posprobe
torch.manual_seed(0)
config = tf.LlamaConfig(vocab_size=262144, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32768)
net = tf.LlamaForCausalLM(config).eval()
ids = np.random.default_rng(0).integers(3, 262144, size=32768 + 8).tolist()
result = posprobe.context(net, documents=[ids], lengths=[32768], windows=1)
print(result.perplexity[0, 0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


@pytest.mark.slow
def test_context_with_a_262k_vocabulary_at_32k_tokens_runs_within_2_gb():
    """The logits of one window are 32 GiB at once (32,768 x 262,144 x 4 bytes): block by block the whole process
    peaks under 2 GB (ru_maxrss of a child process; about 0.9 GB measured, RESULTS.md §35)."""
    done = subprocess.run([sys.executable, "-c", BIG_VOCAB], env=child_env(), capture_output=True, text=True,
                          timeout=3000)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    perplexity, peak = done.stdout.split()
    assert np.isfinite(float(perplexity)) and int(peak) < 2 * 10**9, done.stdout


# -- F. library logging under --device auto ----------------------------------------------------------------------------
@pytest.mark.slow  # a child process loading every layer from disk
@pytest.mark.parametrize("command", ["attention", "context"])
def test_device_auto_loads_in_silence(command, causal_llama_folder, texts_file, long_text, tmp_path):
    """accelerate's "Some parameters are on the meta device" line reached stderr (a child process: pytest's log
    capture would hide it in this one)."""
    args = command_args(command, causal_llama_folder, texts_file, long_text, tmp_path)
    argv = [sys.executable, "-m", "posprobe", *map(str, args), "--device", "auto", "--max-memory", "cpu=20KB", "--json"]
    done = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    json.loads(done.stdout)
