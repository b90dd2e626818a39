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
from tiny_tokenizer import word_tokenizer

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
        pytest.param("states", marks=pytest.mark.slow),
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


# -- texts the tokenizer or the model cannot use ----------------------------------------------------------------
def test_blank_records_are_skipped_in_every_format(tmp_path):
    """A .jsonl or .csv whose text column is empty or white space on some rows gives the other rows, as a .txt
    skips blank lines: a blank text would otherwise reach the tokenizer as special tokens only."""
    from posprobe.texts.reading import iter_texts

    (tmp_path / "t.jsonl").write_text('{"s": "a b"}\n{"s": "   "}\n{"s": ""}\n{"s": "c"}\n')
    (tmp_path / "t.csv").write_text('s\n"a b"\n"  "\n""\nc\n')
    (tmp_path / "t.txt").write_text("a b\n   \n\nc\n")
    for name, column in (("t.jsonl", "s"), ("t.csv", "s"), ("t.txt", None)):
        assert list(iter_texts(tmp_path / name, column)) == ["a b", "c"], name


def test_text_of_special_tokens_only_is_one_line(tiny_bert_folder, tmp_path, capsys):
    """A text the tokenizer keeps nothing of but [CLS] [SEP] (control characters only) has no position to measure."""
    path = tmp_path / "ctrl.txt"
    path.write_text("w1 w2 w3\n\u200b\u200b\x07\n")
    args = ["attention", tiny_bert_folder, "--text", path, "--max-length", "12", "--out", tmp_path / "out"]
    assert_one_line_error(*run_cli(args, capsys), "special tokens only")
    assert not (tmp_path / "out").exists()


def test_tokenizer_of_another_model_is_refused(tiny_bert_folder, tmp_path, capsys):
    """Tokenizer files that give ids beyond the model's embedding rows (copied from a model with a bigger
    vocabulary) are one line, not an index error inside the embedding."""
    folder = tmp_path / "mixed"
    shutil.copytree(tiny_bert_folder, folder)
    word_tokenizer(200).save_pretrained(folder)
    text = tmp_path / "t.txt"
    text.write_text("w150 w199 w3\n")
    args = ["attention", folder, "--text", text, "--max-length", "12", "--out", tmp_path / "out"]
    assert_one_line_error(*run_cli(args, capsys), "outside the model's", "token embeddings")
    assert not (tmp_path / "out").exists()


def test_input_ids_outside_the_vocabulary_are_refused():
    import posprobe
    from posprobe.errors import PosprobeError

    with pytest.raises(PosprobeError, match="outside the model's 99 token embeddings"):
        posprobe.attention_profiles(tiny_model("bert"), input_ids=[[2, 5, 99, 3]], max_length=8)


# -- cheap checks before the model is read ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command, extra",
    [("states", []), ("profiles", ["--input", "position-mean", "--layers", "0"])],
)
def test_min_texts_above_the_number_of_texts_is_refused_first(command, extra, texts_file, tmp_path, capsys):
    """--min-texts 50 on 20 texts can keep no position: refused before the model (here a missing folder) is read."""
    args = [command, tmp_path / "no-model", "--text", texts_file, "--column", "sentence", "--min-texts", "50"]
    line = assert_one_line_error(*run_cli([*args, *extra, "--out", tmp_path / "out"], capsys), "--min-texts 50", "20")
    assert "no-model" not in line


@pytest.mark.parametrize("command", ["fhat", "profiles", "rotary"])
def test_max_length_below_two_is_refused_first(command, texts_file, tmp_path, capsys):
    args = [command, tmp_path / "no-model", "--text", texts_file, "--column", "sentence", "--max-length", "1"]
    assert_one_line_error(*run_cli([*args, "--out", tmp_path / "out"], capsys), "--max-length")


# -- text files as editors, spreadsheets and cut-off exports write them --------------------------------------------
def _hostile_text_files(folder):
    """{name: (file, column, words the error must hold or None where the file is read)}."""
    rows = "".join(f"w{i} w{i + 1}\n" for i in range(20))
    files = {
        "bom.csv": (b"\xef\xbb\xbfsentence\n" + rows.encode(), "sentence", None),
        "bom.jsonl": (b"\xef\xbb\xbf" + b'{"s": "w1 w2"}\n' * 3, "s", None),
        "bom-only.txt": (b"\xef\xbb\xbf\n", None, "holds no texts"),
        "long-field.csv": (b"s\n" + b"w1 " * 60_000 + b"\nw2\n", "s", None),
        "no-header.csv": (b"w1 w2,1\nw3,0\n", "s", "first line"),
        "deep.jsonl": (b'{"s": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "s", "nested too deeply"),
        "surrogate.jsonl": (b'{"s": "w1 \\ud83d"}\n', "s", "surrogate"),
        "long-list.jsonl": (b'{"s": [' + b"1, " * 10_000 + b"1]}\n", "s", "is not text"),
    }
    out = {}
    for name, (data, column, words) in files.items():
        (folder / name).write_bytes(data)
        out[name] = (folder / name, column, words)
    return out


def test_hostile_text_files_are_read_or_refused_in_one_line(tmp_path):
    """A byte-order mark is not part of the first text or column name; a 180 kB .csv field is one text (the csv
    module refused fields over 128 KiB with an internal error); deep JSON nesting (RecursionError) and a lone half
    of a surrogate pair (the tokenizer's TypeError) are one line naming the file."""
    from posprobe.errors import PosprobeError
    from posprobe.texts.reading import check_texts, iter_texts

    for name, (path, column, words) in _hostile_text_files(tmp_path).items():
        if words is None:
            texts = list(iter_texts(path, column))
            assert texts and not any("\ufeff" in t for t in texts), name
            continue
        with pytest.raises(PosprobeError) as err:
            check_texts(path, column)
        line = str(err.value)
        assert words in line and "\n" not in line and len(line) < 400 and str(path) in line, (name, line)


def test_hostile_text_file_is_refused_before_the_model_is_read(tmp_path, capsys):
    files = _hostile_text_files(tmp_path)
    for command in ("states", "attention"):
        path, column, _ = files["surrogate.jsonl"]
        args = [command, tmp_path / "no-model", "--text", path, "--column", column, "--out", tmp_path / "out"]
        line = assert_one_line_error(*run_cli(args, capsys), "surrogate")
        assert "no-model" not in line and not (tmp_path / "out").exists()


# -- tokenizer files a cut-short download leaves -------------------------------------------------------------------
def test_tokenizer_config_without_its_vocabulary_is_refused(tiny_bert_folder, texts_file, tmp_path, capsys):
    """tokenizer_config.json without tokenizer.json: transformers builds a tokenizer of the 5 special tokens that
    maps every word to [UNK], and `states` measured 20 identical [UNK] sequences with exit 0."""
    folder = tmp_path / "no-vocab"
    shutil.copytree(tiny_bert_folder, folder)
    (folder / "tokenizer.json").unlink()
    args = ["states", folder, "--text", texts_file, "--column", "sentence", "--max-length", "12", "--min-texts", "2"]
    assert_one_line_error(*run_cli([*args, "--out", tmp_path / "out"], capsys), "no vocabulary", "5 special tokens")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "content, words",
    [('{"foo": 1}', "KeyError: 'added_tokens'"), ("{'version'", "JSONDecodeError"), ("", "JSONDecodeError")],
)
def test_damaged_tokenizer_json_names_the_failure(content, words, tiny_bert_folder, tmp_path):
    from posprobe.checkpoint.loading import load_tokenizer
    from posprobe.errors import PosprobeError

    folder = tmp_path / "damaged"
    shutil.copytree(tiny_bert_folder, folder)
    (folder / "tokenizer.json").write_text(content)
    with pytest.raises(PosprobeError, match=f"no usable tokenizer in .*{words}"):
        load_tokenizer(folder)


# -- checkpoints whose config and weights disagree (crafted GGUF metadata, a tensor lost) --------------------------
def _gguf_variant(tiny_ggufs, tmp_path, **edits):
    from gguf_files import rewrite_gguf

    return rewrite_gguf(tiny_ggufs["llama", "Q8_0"], tmp_path / "crafted.gguf", **edits)


def _u32(value):
    import gguf

    return (value, gguf.GGUFValueType.UINT32)


@pytest.mark.parametrize(
    "edits, words",
    [
        ({"set_fields": {"llama.block_count": _u32(2**31)}}, "block_count = 2147483648, but the file holds"),
        ({"set_fields": {"llama.block_count": _u32(1)}}, "block_count = 1, but the file holds the tensors of layers"),
        ({"drop_fields": ["llama.block_count"]}, "lacks llama.block_count"),
        ({"set_fields": {"llama.attention.head_count_kv": _u32(0)}}, "num_key_value_heads = 0"),
        ({"set_fields": {"llama.rope.dimension_count": _u32(0)}}, "head_dim = 0"),
        ({"set_fields": {"llama.rope.freq_base": ("1e4", 8)}}, "rope_theta = '1e4'"),  # 8: STRING
        ({"set_fields": {"llama.rope.freq_base": (float("nan"), 6)}}, "rope_theta = nan"),  # 6: FLOAT32
        ({"set_fields": {"llama.rope.freq_base": (0.0, 6)}}, "rope_theta = 0.0"),
    ],
    ids=["block-count-huge", "block-count-short", "block-count-missing", "kv-heads-0", "rope-dims-0", "rope-base-text",
         "rope-base-nan", "rope-base-0"],
)  # fmt: skip
def test_crafted_gguf_metadata_is_refused_when_the_file_is_opened(edits, words, tiny_ggufs, tmp_path):
    """A block count of 2**31 had transformers build layers until it was killed, one of 1 analysed half the file;
    0 key/value heads or rotary dimensions, or a rotary base that is text, were ZeroDivisionError / TypeError
    internal errors; a base of NaN or 0 gave NaN profiles with exit 0. Each is one line naming the GGUF
    metadata (not config.json) and saying to convert the model again."""
    from posprobe.checkpoint import resolve_model
    from posprobe.errors import PosprobeError

    file = _gguf_variant(tiny_ggufs, tmp_path, **edits)
    with pytest.raises(PosprobeError) as err:
        resolve_model(file)
    line = str(err.value)
    assert words in line and "GGUF metadata" in line and "config.json" not in line and "convert" in line, line


def test_crafted_gguf_through_the_cli_is_one_line(tiny_ggufs, tmp_path, capsys):
    file = _gguf_variant(tiny_ggufs, tmp_path, set_fields={"llama.block_count": _u32(2**31)})
    for command in (["rotary", file, "--layers", "0"], ["fhat", file], ["profiles", file, "--layers", "0"]):
        assert_one_line_error(
            *run_cli([*command, "--positions", "24", "--out", tmp_path / "out"], capsys), "2147483648"
        )
        assert not (tmp_path / "out").exists()


def test_a_lost_tensor_is_refused_not_filled_with_random_values(tiny_ggufs, tiny_llama_folder, tmp_path):
    """transformers fills a parameter the file lacks with random values and only logs it: `attention` and `states`
    measured layer 1 of a file without its key projection as if it were trained."""
    from safetensors.numpy import load_file, save_file

    import posprobe
    from posprobe.errors import PosprobeError

    folder = tmp_path / "lost"
    shutil.copytree(tiny_llama_folder, folder)
    tensors = load_file(folder / "model.safetensors")
    del tensors["layers.1.self_attn.k_proj.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    gguf_file = _gguf_variant(tiny_ggufs, tmp_path, drop_tensors=["blk.1.attn_k.weight"])
    for model in (folder, gguf_file):
        with pytest.raises(PosprobeError, match=r"lacks 1 weight tensor .*'layers.1.self_attn.k_proj.weight'.*random"):
            posprobe.attention_profiles(model, input_ids=[[1, 5, 6, 7, 8, 9]] * 4, max_length=6)
    posprobe.load_model(tiny_llama_folder)  # a complete checkpoint loads


def test_config_claiming_billions_of_layers_is_refused_before_any_model_is_built(
    tiny_llama_folder, texts_file, tmp_path, capsys
):
    """num_hidden_layers = 2**31 beside 2 layers of weights: `profiles` looped over the layers' kinds and `states`
    had transformers build them, both until killed."""
    folder = tmp_path / "claims"
    shutil.copytree(tiny_llama_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2**31}))
    text = ["--text", texts_file, "--column", "sentence", "--max-length", "8", "--min-texts", "2"]
    for command in (["profiles", folder, "--layers", "0", "--positions", "16"], ["states", folder, *text]):
        assert_one_line_error(*run_cli([*command, "--out", tmp_path / "out"], capsys), "2147483648")
        assert not (tmp_path / "out").exists()
