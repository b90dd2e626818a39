"""`posprobe attention` (SPEC §10): streamed accumulators against a brute-force per-pair loop, recorded
probabilities against the eager model's `output_attentions`, the CLI contract and its bad-input errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_tokenizer import word_tokenizer
from typer.testing import CliRunner

from posprobe.analysis.empirical import masked_toeplitz_r2, offset_sums, profile_correlation
from posprobe.cli import app, main
from posprobe.errors import PosprobeError
from posprobe.pipelines.attention import RECORD_NAME, attention_profiles, register_recording_attention

ROOT = Path(__file__).resolve().parents[1]
CLS, SEP = 2, 3


def tiny_model(family: str):
    import transformers as tf

    torch.manual_seed(0)
    if family == "bert":
        model = tf.BertModel(
            tf.BertConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=37,
                vocab_size=99,
                max_position_embeddings=64,
            )
        )
    elif family == "gpt2":
        model = tf.GPT2Model(tf.GPT2Config(vocab_size=99, n_positions=64, n_embd=32, n_head=4, n_layer=2))
    elif family == "llama":
        model = tf.LlamaModel(
            tf.LlamaConfig(
                vocab_size=99,
                hidden_size=32,
                intermediate_size=48,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
            )
        )
    else:
        raise ValueError(family)
    return model.eval()


def sequences(count: int = 7, seed: int = 1) -> list[list[int]]:
    """Texts of different lengths (2..11 tokens) framed by CLS ... SEP, so batches are padded."""
    rng = np.random.default_rng(seed)
    return [[CLS, *rng.integers(5, 99, size=int(rng.integers(0, 10))).tolist(), SEP] for _ in range(count)]


# -- the reference: each text alone through the eager model, then a loop over pairs ------------------------
def reference_scores(model, family: str, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(S, A) of every layer (L, H, m, m) for one unpadded text, S from the layer inputs by hand."""
    model.set_attn_implementation("eager")
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model(input_ids=x, output_attentions=True, output_hidden_states=True)
        scores = []
        for layer in range(len(out.attentions)):
            h = out.hidden_states[layer]
            if family == "bert":
                att = model.encoder.layer[layer].attention.self
                q, k = att.query(h), att.key(h)
                heads = att.num_attention_heads
            elif family == "gpt2":
                block = model.h[layer]
                q, k, _ = block.attn.c_attn(block.ln_1(h)).split(block.attn.embed_dim, dim=2)
                heads = block.attn.num_heads
            else:
                from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

                block = model.layers[layer]
                hn = block.input_layernorm(h)
                heads = model.config.num_attention_heads
                d = model.config.hidden_size // heads
                q = block.self_attn.q_proj(hn).view(1, -1, heads, d).transpose(1, 2)
                k = block.self_attn.k_proj(hn).view(1, -1, model.config.num_key_value_heads, d).transpose(1, 2)
                cos, sin = model.rotary_emb(hn, torch.arange(len(ids))[None])
                q, k = apply_rotary_pos_emb(q, k, cos, sin)
                k = k.repeat_interleave(heads // k.shape[1], dim=1)
                scores.append((q @ k.transpose(-1, -2) / d**0.5)[0].double().numpy())
                continue
            d = q.shape[-1] // heads
            q = q.view(1, -1, heads, d).transpose(1, 2)
            k = k.view(1, -1, heads, d).transpose(1, 2)
            scores.append((q @ k.transpose(-1, -2) / d**0.5)[0].double().numpy())
    return np.stack(scores), np.stack([a[0].double().numpy() for a in out.attentions])


def brute_force(model, family: str, texts, n: int, causal: bool, specials=()):
    """Every SPEC §10 quantity by explicit loops over texts, layers, heads and pairs."""
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    s_sum, a_sum, c = np.zeros((L, H, 2 * n - 1)), np.zeros((L, H, 2 * n - 1)), np.zeros(2 * n - 1)
    m_sum, m_cnt = np.zeros((L, H, n, n)), np.zeros((n, n))
    dist, queries = np.zeros((L, H)), 0
    for ids in texts:
        S, A = reference_scores(model, family, ids)
        keep = [t for t, tok in enumerate(ids) if tok not in specials]
        for i in keep:
            keys = [j for j in keep if not causal or j <= i]
            queries += 1
            for j in keys:
                k = j - i + n - 1
                c[k] += 1
                m_cnt[i, j] += 1
                for layer in range(L):
                    for h in range(H):
                        s_sum[layer, h, k] += S[layer, h, i, j]
                        a_sum[layer, h, k] += A[layer, h, i, j]
                        m_sum[layer, h, i, j] += S[layer, h, i, j]
                        dist[layer, h] += A[layer, h, i, j] * abs(j - i)
    with np.errstate(invalid="ignore"):
        m = m_sum / m_cnt
        r2 = np.full((L, H), np.nan)
        for layer in range(L):
            for h in range(H):
                entries = [(i, j) for i in range(n) for j in range(n) if m_cnt[i, j] > 0]
                diag: dict[int, list[float]] = {}
                for i, j in entries:
                    diag.setdefault(j - i, []).append(m[layer, h, i, j])
                vals = np.array([m[layer, h, i, j] for i, j in entries])
                rss = sum((m[layer, h, i, j] - np.mean(diag[j - i])) ** 2 for i, j in entries)
                r2[layer, h] = 1 - rss / np.sum((vals - vals.mean()) ** 2)
        return dict(
            score_profiles=s_sum / c,
            prob_profiles=a_sum / c,
            pair_counts=c,
            mean_distance=dist / queries,
            mean_scores=m,
            toeplitz_r2=r2,
            n_queries=queries,
        )


@pytest.mark.parametrize(
    "family, causal, exclude",
    [("bert", False, False), ("bert", False, True), ("gpt2", True, False), ("llama", True, False)],
)
def test_streamed_accumulators_equal_brute_force(family, causal, exclude):
    model = tiny_model(family)
    texts, n = sequences(), 12
    specials = (CLS, SEP) if exclude else ()
    ref = brute_force(model, family, texts, n, causal, specials)
    res = attention_profiles(
        model, input_ids=texts, special_ids=[CLS, SEP], exclude_special=exclude, max_length=n, batch_size=3
    )
    p = res.profiles
    assert res.n_texts == len(texts) and res.causal == causal
    np.testing.assert_array_equal(p.pair_counts[0], ref["pair_counts"])
    assert p.n_queries[0] == ref["n_queries"]
    for name in ("score_profiles", "prob_profiles", "mean_distance", "mean_scores", "toeplitz_r2"):
        np.testing.assert_allclose(getattr(p, name), ref[name], rtol=1e-5, atol=1e-5, err_msg=name)
    if causal:
        assert np.isnan(p.score_profiles[..., n:]).all()  # no pair looks right


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_recorded_probabilities_equal_eager_output_attentions(family):
    model = tiny_model(family)
    texts = sequences(5, seed=3)
    m = max(map(len, texts))
    ids = torch.tensor([t + [0] * (m - len(t)) for t in texts])
    mask = torch.tensor([[1] * len(t) + [0] * (m - len(t)) for t in texts])
    with torch.no_grad():
        model.set_attn_implementation("eager")
        eager = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        register_recording_attention()
        model.set_attn_implementation(RECORD_NAME)
        ours = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    for a, b in zip(ours.attentions, eager.attentions):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ours.last_hidden_state, eager.last_hidden_state, rtol=1e-6, atol=1e-6)


def test_batch_size_and_order_do_not_change_the_result():
    model = tiny_model("bert")
    texts = sequences(9, seed=5)
    one = attention_profiles(model, input_ids=texts, max_length=12, batch_size=1).profiles
    many = attention_profiles(model, input_ids=texts[::-1], max_length=12, batch_size=4).profiles
    np.testing.assert_allclose(one.score_profiles, many.score_profiles, rtol=1e-5, atol=1e-7)  # float32 model
    np.testing.assert_allclose(one.mean_distance, many.mean_distance, rtol=1e-5)


def test_truncation_to_max_length():
    model = tiny_model("bert")
    res = attention_profiles(model, input_ids=[list(range(5, 40))], max_length=8).profiles
    assert res.pair_counts.shape == (2, 15) and res.pair_counts[0, 7] == 8  # 8 tokens kept, k = 0 once each


# -- pure pieces --------------------------------------------------------------------------------------------
def test_offset_sums_match_traces():
    x = np.random.default_rng(0).normal(size=(3, 6, 6))
    expected = np.array([[np.trace(m, k) for k in range(-5, 6)] for m in x])
    np.testing.assert_allclose(offset_sums(x), expected, atol=1e-12)
    np.testing.assert_allclose(offset_sums(torch.from_numpy(x)).numpy(), expected, atol=1e-12)


def test_masked_toeplitz_r2_known_answers():
    n = 6
    toeplitz = np.subtract.outer(np.arange(n), np.arange(n)) ** 2.0
    causal = np.tril(np.ones((n, n), bool))
    noisy = toeplitz + np.random.default_rng(0).normal(size=(n, n))
    assert masked_toeplitz_r2(toeplitz, np.ones((n, n), bool)) == pytest.approx(1.0)
    # whatever sits outside the entries with data does not matter
    assert masked_toeplitz_r2(np.where(causal, toeplitz, 1e6), causal) == pytest.approx(1.0)
    assert np.isnan(masked_toeplitz_r2(np.full((n, n), 3.0), causal))  # constant: undefined
    assert masked_toeplitz_r2(noisy, causal) < 1


def test_profile_correlation():
    x = np.array([1.0, 2.0, np.nan, 4.0, 5.0])
    assert profile_correlation(x, 2 * x + 1) == pytest.approx(1.0)
    assert profile_correlation(x, -x) == pytest.approx(-1.0)
    assert np.isnan(profile_correlation(x, np.ones(5)))  # constant: undefined
    assert np.isnan(profile_correlation(np.array([1.0, np.nan, np.nan]), np.arange(3.0)))


# -- families that cannot be recorded --------------------------------------------------------------------
def test_model_whose_attention_is_not_a_matrix_is_refused():
    """Longformer attends in sliding chunks; the other families run (tests/test_capture_families.py)."""
    import transformers as tf

    from posprobe.errors import PosprobeError

    config = tf.LongformerConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=37, max_position_embeddings=66, attention_window=4)  # fmt: skip
    with pytest.raises(PosprobeError, match="not one softmax over all keys"):
        attention_profiles(tf.LongformerModel(config).eval(), input_ids=sequences(2), max_length=12)


# -- weights correlation, CLI ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_bert_folder(tmp_path_factory):
    """A tiny BERT checkpoint with an offline WordPiece tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-bert-tok")
    word_tokenizer(60).save_pretrained(folder)
    tiny_model("bert").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory):
    rng = np.random.default_rng(7)
    path = tmp_path_factory.mktemp("texts") / "texts.jsonl"
    rows = [{"sentence": " ".join(f"w{x}" for x in rng.integers(0, 60, size=rng.integers(1, 12)))} for _ in range(20)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_json_contract_and_fit_tisa_reads_the_npz(tiny_bert_folder, texts_file, tmp_path):
    out = tmp_path / "attn"
    runner = CliRunner()
    args = ["attention", str(tiny_bert_folder), "--text", str(texts_file), "--column", "sentence"]
    result = runner.invoke(app, [*args, "--max-length", "16", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    for key in ("model", "n_texts", "max_length", "npz", "mean_distance", "toeplitz_r2", "weights_correlation"):
        assert key in record
    assert record["n_texts"] == 20 and record["max_length"] == 16 and record["causal"] is False
    assert np.shape(record["mean_distance"]) == (2, 4) and np.shape(record["weights_correlation"]) == (2, 4)
    assert "faithful" in record["weights_profile"]
    with np.load(record["npz"]) as z:
        assert z["score_profiles"].shape == z["prob_profiles"].shape == (2, 4, 31)
        assert z["offsets"].tolist() == list(range(-15, 16)) and z["pair_counts"].shape == (31,)
        assert z["mean_distance"].shape == z["toeplitz_r2"].shape == z["weights_correlation"].shape == (2, 4)
        for name in ("first_token_mass", "special_token_mass", "distance_without_first"):
            assert z[name].shape == (2, 4) and np.shape(record[name]) == (2, 4)
        for name in ("sink_rate", "uniform_distance", "uniform_distance_without_first"):
            assert z[name].shape == (2,) and np.shape(record[name]) == (2,)
    assert record["sink_threshold"] == 0.3 and record["n_sink_queries"] > 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["attention.npz", "mean_distance.png", "attention_profiles_layer0.png", "attention_profiles_layer1.png",
         "sinks.png"]
    )  # fmt: skip
    fit = runner.invoke(
        app, ["fit-tisa", record["npz"], "--profile", "score", "--kernels", "1", "--window", "4", "--json",
              "--out", str(tmp_path / "fit")]
    )  # fmt: skip
    assert fit.exit_code == 0, fit.output
    assert json.loads(fit.stdout)["mode"] == "empirical-score"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--text", "missing.txt"], "does not exist"),
        (["--text", "{empty}"], "holds no texts"),
        (["--text", "{texts}", "--column", "text"], "no column 'text'"),
        (["--text", "{texts}"], "--column"),
        (["--text", "{texts}", "--column", "sentence", "--max-length", "0"], "--max-length must be at least 2"),
        (["--text", "{texts}", "--column", "sentence", "--max-length", "100"], "--max-length 100 exceeds"),
        (["--text", "{texts}", "--column", "sentence", "--device", "nonsense"], "unknown --device"),
    ],
)
def test_cli_bad_input_one_line_exit_2_nothing_written(tiny_bert_folder, texts_file, tmp_path, capsys, extra, message):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    extra = [e.replace("{empty}", str(empty)).replace("{texts}", str(texts_file)) for e in extra]
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as info:
        main(["attention", str(tiny_bert_folder), *extra, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and err.startswith("posprobe: error: ") and "\n" not in err
    assert message in err
    assert not out.exists()


@pytest.mark.slow
def test_ctrl_c_exits_130_and_leaves_no_output(tiny_bert_folder, tmp_path):
    texts = tmp_path / "many.txt"
    texts.write_text("w1 w2 w3 w4 w5 w6\n" * 50000)
    out = tmp_path / "interrupted"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "posprobe",
        "attention",
        str(tiny_bert_folder),
        "--text",
        str(texts),
        "--max-length",
        "16",
    ]
    proc = subprocess.Popen(
        ["env", "--default-signal=INT", *cmd, "--batch-size", "1", "--out", str(out), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    # well into the run (50,000 texts one at a time take minutes), and past the imports even on a loaded machine:
    # a SIGINT that lands while Python is still importing can end `python -m` by the signal itself (exit -2)
    time.sleep(12)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    # no result, no folder, no partial file; under --json the failure itself is one JSON object on stdout
    assert json.loads(stdout)["exit_code"] == 130 and not out.exists()
    assert proc.returncode == 130, stderr.decode()
    assert stderr.decode().strip().splitlines()[-1].startswith("posprobe: error: interrupted")


def test_interrupted_write_leaves_nothing(monkeypatch, tmp_path):
    """A Ctrl-C while the files are written: no file, no staging folder, no folder the run created."""
    from posprobe.pipelines.attention import write_attention
    from posprobe.plotting import attention as plotting_attention

    result = attention_profiles(tiny_model("bert"), input_ids=sequences(3), max_length=12)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plotting_attention, "mean_distance_chart", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_attention(result, tmp_path / "new" / "out")
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("x")
    with pytest.raises(KeyboardInterrupt):
        write_attention(result, existing)
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]


def test_hub_text_spec_is_parsed_or_refused():
    from posprobe.pipelines.attention import parse_hub_texts

    assert parse_hub_texts("texts.jsonl") is None
    assert parse_hub_texts("hub:nyu-mll/glue:cola:validation") == ("nyu-mll/glue", "cola", "validation")
    assert parse_hub_texts("hub:imdb:test") == ("imdb", None, "test")
    for bad in ("hub:imdb", "hub:a:b:c:d", "hub::test"):
        with pytest.raises(PosprobeError, match="hub:NAME:SPLIT"):
            parse_hub_texts(bad)


def test_hub_texts_offline_fail_at_once_with_one_line(tiny_bert_folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "never"
    started = time.perf_counter()
    with pytest.raises(SystemExit) as info:
        main(["attention", str(tiny_bert_folder), "--text", "hub:no-such/dataset:test", "--column", "text",
              "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "\n" not in err and "HF_HUB_OFFLINE is set" in err
    assert time.perf_counter() - started < 20 and not out.exists()


def test_hub_texts_are_read_from_the_named_split_and_column(tiny_bert_folder, tmp_path, monkeypatch, capsys):
    """The hub path end to end, with `datasets.load_dataset` answered by an in-memory dataset."""
    import datasets

    asked = []

    def fake_load(name, config=None, split=None, **kwargs):
        asked.append((name, config, split))
        return datasets.Dataset.from_dict({"sentence": ["w1 w2 w3", "", "w4 w5"], "label": [0, 1, 0]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    args = ["attention", str(tiny_bert_folder), "--text", "hub:nyu-mll/glue:cola:validation", "--column"]
    result = CliRunner().invoke(app, [*args, "sentence", "--max-length", "8", "--out", str(tmp_path / "a"), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["n_texts"] == 2 and record["text"] == "hub:nyu-mll/glue:cola:validation"  # the empty row skipped
    assert asked and set(asked) == {("nyu-mll/glue", "cola", "validation")}
    with pytest.raises(SystemExit) as info:
        main([*args, "label", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "column 'label' is not text" in err and "\n" not in err
    assert not (tmp_path / "b").exists()


def test_weights_profiles_read_the_model_once_at_max_length(tmp_path, monkeypatch):
    """The weights-based profiles behind weights_correlation come from one model reader over max_length positions:
    a rotary model allowing more than 512 positions gets them at max_length 600 (they were refused as 'the position
    table has 512 rows': it has no table), and the checkpoint's weights are opened once, not once per layer."""
    import posprobe.pipelines.score_reader as score_reader
    from posprobe.analysis.toeplitz import diagonal_means
    from posprobe.pipelines.weights import fhat

    model = tiny_model("llama")
    model.config.max_position_embeddings = 2048
    model.save_pretrained(tmp_path / "llama")
    opened = []
    real_open = score_reader.open_weights
    monkeypatch.setattr(score_reader, "open_weights", lambda source: opened.append(source) or real_open(source))
    ids = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    result = attention_profiles(str(tmp_path / "llama"), input_ids=ids, max_length=600, verify=False)
    assert len(opened) == 1, result.weights_note
    assert result.weights_profiles.shape == (2, 4, 1199) and "content-free" in result.weights_note
    expected = diagonal_means(fhat(str(tmp_path / "llama"), 1, positions=600).matrices)
    np.testing.assert_allclose(result.weights_profiles[1], expected, rtol=1e-12, atol=1e-12)
