"""`posprobe context` (SPEC §17): loss by position against a naive loop and transformers' own `labels=` loss,
variants against transformers' ROPE_INIT_FUNCTIONS, the rotary budget against its closed form and a count of
pairs, windows and streams, and hostile input (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from tiny_tokenizer import causal_folder, word_tokenizer

import posprobe
from posprobe.analysis.context_loss import (
    PositionLoss,
    critical_dimension,
    cut_windows,
    log_smooth,
    octave_means,
    rotary_budget,
)
from posprobe.errors import PosprobeError
from posprobe.families import rope_variants as R
from posprobe.pipelines.context import token_stream

VARIANTS = "none,linear:2,dynamic:2,yarn:4,llama3:8"


def tiny_llama(max_positions: int = 32, **overrides):
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=37, vocab_size=99, max_position_embeddings=max_positions,
                            bos_token_id=2, eos_token_id=3, **overrides)  # fmt: skip
    return tf.LlamaForCausalLM(config).eval()


def documents(count: int = 30, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(rng.integers(5, 99, size=rng.integers(3, 30))) for _ in range(count)]


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A tiny Llama (trained length 32) with a WordPiece tokenizer whose [CLS] is its BOS and [SEP] its EOS, and a
    text file of 40 random documents."""
    folder = tmp_path_factory.mktemp("ctx-llama")
    causal_folder(folder, tiny_llama())
    rng = np.random.default_rng(1)
    texts = folder / "docs.txt"
    texts.write_text("".join(" ".join(f"w{x}" for x in rng.integers(0, 60, size=rng.integers(5, 40))) + "\n"
                             for _ in range(40)))  # fmt: skip
    return folder, texts


def test_position_loss_equals_a_naive_loop_and_transformers_labels_loss():
    """loss(t) = mean over windows of -log p(x[t+1] | x[0..t]), each term from its own forward pass over the prefix
    alone; the summed loss of each window equals transformers' `labels=` loss times L - 1."""
    model, docs, length, count = tiny_llama(), documents(), 12, 3
    result = posprobe.context(model, [length], documents=docs, windows=count, bos_id=2)
    stream = [x for i, d in enumerate(docs) for x in ([3] if i else []) + d]  # EOS (3) between documents
    windows = cut_windows(stream, length, count, bos_id=2)
    assert (windows[:, 0] == 2).all() and list(windows[0, 1:]) == stream[: length - 1]
    naive = np.zeros((count, length - 1))
    labels_total = 0.0
    with torch.no_grad():
        for w, ids in enumerate(windows):
            for t in range(length - 1):
                logits = model(torch.as_tensor(ids[: t + 1])[None]).logits[0, -1].double()
                naive[w, t] = -torch.log_softmax(logits, -1)[ids[t + 1]].item()
            x = torch.as_tensor(ids)[None]
            labels_total += model(x, labels=x).loss.item() * (length - 1)
    np.testing.assert_allclose(result.position_loss[0], naive.mean(0), rtol=1e-5, atol=1e-6)
    assert result.position_loss.dtype == np.float64 and result.position_loss.shape == (1, length - 1)
    np.testing.assert_allclose(result.position_loss[0].sum() * count, labels_total, rtol=1e-5)
    assert result.perplexity[0, 0] == pytest.approx(math.exp(naive.mean()), rel=1e-5)
    assert list(result.tokens) == [count * (length - 1)] and result.inv_freq.shape == (1, 4)


def test_token_loss_is_within_a_millionth_of_a_nat_of_float64():
    """The log-sum-exp runs in float32 (the logits' precision); the loss it gives is within 1e-6 nats of a float64
    log-softmax, for logits as large as a real model's (|x| up to ~40) and a large vocabulary."""
    from posprobe.analysis.context_loss import token_nll

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 50, 5000, generator=generator) * 10
    logits[:, :, 7] += 30  # one dominant token, as real next-token distributions have
    ids = torch.randint(0, 5000, (2, 50), generator=generator)
    reference = -torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    ours = token_nll(logits, ids)
    assert ours.dtype == np.float64 and ours.shape == (2, 49)
    np.testing.assert_allclose(ours, reference.numpy(), atol=1e-6, rtol=0)


def test_position_loss_sums_add_across_batches():
    """Batches of windows (or processes, SPEC §19) add: float64 sums and an integer count of windows."""
    rng = np.random.default_rng(0)
    nll = rng.random((7, 5))
    whole, parts = PositionLoss(6), PositionLoss(6)
    whole.add(nll)
    first = PositionLoss(6)
    first.add(nll[:3])
    parts.add(nll[3:])
    parts.merge(first)
    np.testing.assert_allclose(parts.mean, nll.mean(0), rtol=1e-14)
    assert parts.windows == 7 and parts.perplexity == pytest.approx(math.exp(nll.mean()))


def test_batch_size_does_not_change_the_loss():
    model, docs = tiny_llama(), documents()
    one = posprobe.context(model, [10, 20], documents=docs, windows=3)
    many = posprobe.context(model, [10, 20], documents=docs, windows=3, batch_size=2)
    assert one.windows.tolist() == [6, 3]  # length 10 scores the same 60 tokens as 3 windows of 20
    np.testing.assert_allclose(one.position_loss, many.position_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one.perplexity, many.perplexity, rtol=1e-6)


def test_each_variant_uses_transformers_rope_init_and_the_model_is_restored():
    """inv_freq of each variant equals ROPE_INIT_FUNCTIONS on the SPEC §17 parameters (dynamic: for the longest
    length, past the trained length 32), linear is the default divided by its factor (closed form), and the
    model's own rotary module is back after the run ('none' after the variants gives the same loss)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model, docs, longest = tiny_llama(), documents(60), 48
    result = posprobe.context(model, [16, longest], documents=docs, windows=2, rope_scaling=VARIANTS + ",none")
    assert result.variants == ["none", "linear:2", "dynamic:2", "yarn:4", "llama3:8"]
    d = 8  # head_dim 32 / 4
    default = 10000.0 ** (-np.arange(0, d, 2) / d)
    np.testing.assert_allclose(result.inv_freq[0], default, rtol=1e-6)
    np.testing.assert_allclose(result.inv_freq[1], default / 2, rtol=1e-6)
    for i, variant in enumerate(R.parse_variants(VARIANTS)[1:], start=1):
        config = R.variant_config(model.config, variant)
        assert config.rope_parameters["original_max_position_embeddings"] == 32
        assert config.max_position_embeddings == 32 and config.rope_parameters["rope_theta"] == 10000.0
        expected, scaling = ROPE_INIT_FUNCTIONS[variant.rope_type](config, None, seq_len=longest)
        np.testing.assert_allclose(result.inv_freq[i], expected.double().numpy(), rtol=1e-6, err_msg=variant.name)
        assert result.attention_scaling[i] == pytest.approx(scaling)
    assert not np.allclose(result.inv_freq[2], default)  # dynamic moved past the trained length
    assert result.perplexity[1, 0] != pytest.approx(result.perplexity[0, 0], rel=1e-9)  # linear changes the model
    assert type(model.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"
    assert model.model.rotary_emb.rope_type == "default"
    again = posprobe.context(model, [16, longest], documents=docs, windows=2)
    np.testing.assert_allclose(again.position_loss[0], result.position_loss[0], rtol=1e-12)
    assert result.beyond_trained == [longest] and result.trained_length == 32


def test_layer_type_configs_scale_only_their_full_attention_setting():
    import transformers as tf

    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    config = tf.Gemma3TextConfig(**sizes, intermediate_size=37, vocab_size=99, max_position_embeddings=64)
    scaled = R.variant_config(config, R.RopeVariant("yarn:4", "yarn", 4.0))
    assert scaled.rope_parameters["full_attention"]["rope_type"] == "yarn"
    assert scaled.rope_parameters["sliding_attention"] == config.rope_parameters["sliding_attention"]
    assert R.variant_key(scaled) == "full_attention"


def test_rope_type_keyed_configs_scale_their_compressed_layers_rope():
    """DeepSeek V4 keys its rope settings by rope type: 'main' (plain, its sliding layers) and 'compress' (YaRN, its
    compressed layers, which see past the window): the base setting, the trained length and a variant are the
    'compress' one's, the sliding layers' rope is left as it is, and the rebuilt rotary module says so."""
    from family_models import case
    from transformers import AutoConfig
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    yarn = dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0, original_max_position_embeddings=16)
    config = AutoConfig.for_model("deepseek_v4", **{**case("deepseek_v4").config, "rope_parameters": yarn})
    assert list(config.rope_parameters) == ["main", "compress"]  # the sliding layers' setting comes first
    assert R.variant_key(config) == "compress"
    assert R.base_parameters(config)["rope_theta"] == 1000.0 and R.base_parameters(config)["rope_type"] == "yarn"
    assert R.trained_length(config) == 16  # the compressed layers' YaRN length, not max_position_embeddings
    scaled = R.variant_config(config, R.RopeVariant("linear:2", "linear", 2.0))
    assert scaled.rope_parameters["main"] == config.rope_parameters["main"]
    assert scaled.rope_parameters["compress"]["rope_type"] == "linear"
    assert scaled.rope_parameters["compress"]["rope_theta"] == 1000.0
    before, after = DeepseekV4RotaryEmbedding(config), DeepseekV4RotaryEmbedding(scaled)
    torch.testing.assert_close(R.inv_freq_of(after, "main")[0], R.inv_freq_of(before, "main")[0])
    plain = 1.0 / 1000.0 ** (torch.arange(0, 4, 2).float() / 4)  # rope on 4 of 8 dims, base 1000, halved by linear:2
    torch.testing.assert_close(R.inv_freq_of(after, "compress")[0], plain / 2)


@pytest.mark.parametrize(
    "d, theta, trained",
    [(128, 1e4, 4096), (64, 1e4, 2048), (64, 1e5, 8192), (128, 5e5, 8192), (8, 10.0, 64), (32, 1e4, 4)],
)
def test_budget_equals_the_closed_form_and_a_count_of_pairs(d, theta, trained):
    """d_extra / 2 is the number of pairs whose wavelength 2 pi theta^(2f/d) is shorter than T (they complete a
    period within T); T_extra = 2 pi theta^(d_extra / d)."""
    wavelengths = 2 * np.pi * theta ** (np.arange(0, d, 2) / d)
    budget = rotary_budget(d, theta, trained, {"none": 2 * np.pi / wavelengths})
    assert budget["critical_dimension"] == 2 * int((wavelengths < trained).sum())
    assert budget["extrapolation_limit"] == pytest.approx(2 * np.pi * theta ** (budget["critical_dimension"] / d))
    assert budget["variants"][0]["pairs_beyond_trained_length"] == int((wavelengths > trained).sum())


def test_budget_of_llama_2_7b():
    """Liu et al. 2023: Llama-2-7B (d 128, theta 10000, T 4096) has critical dimension 92 and extrapolation limit
    about 4,712 tokens."""
    budget = rotary_budget(128, 10000.0, 4096)
    assert budget["critical_dimension"] == 92 == critical_dimension(128, 10000.0, 4096)
    assert round(budget["extrapolation_limit"]) == 4712


def test_windows_and_streams():
    stream = list(range(20))
    assert cut_windows(stream, 5, 4).tolist() == [list(range(i * 5, i * 5 + 5)) for i in range(4)]
    assert cut_windows(stream, 5, 2, bos_id=99).tolist() == [[99, 0, 1, 2, 3], [99, 4, 5, 6, 7]]
    with pytest.raises(ValueError):
        cut_windows(stream, 6, 5)

    def docs():  # tokenizing stops as soon as the stream holds what the windows need
        yield [1, 2, 3]
        yield [4, 5]
        raise AssertionError("read one document too many")

    assert token_stream(docs(), 6, None, eos_id=0) == ([1, 2, 3, 0, 4, 5], 2)
    assert token_stream([[1], [], [2]], 99, None, eos_id=None) == ([1, 2], 2)


def test_octaves_and_smoothing_keep_the_mean():
    loss = np.random.default_rng(0).random(100)
    edges, means = octave_means(loss)
    assert edges.tolist() == [0, 1, 2, 4, 8, 16, 32, 64, 100]
    assert means[3] == pytest.approx(loss[4:8].mean())
    t, smooth = log_smooth(loss)
    assert np.all(np.diff(t) > 0) and t[0] == 0 and smooth[0] == loss[0]


def test_cli_context_contract(llama_folder, tmp_path):
    from typer.testing import CliRunner

    from posprobe.cli import app

    folder, texts = llama_folder
    out = tmp_path / "c"
    args = ["context", str(folder), "--text", str(texts), "--lengths", "16,48", "--windows", "2",
            "--rope-scaling", "none,yarn:2", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["variants"] == ["none", "yarn:2"] and record["lengths"] == [16, 48]
    assert record["trained_length"] == 32 and record["beyond_trained_length"] == [48]
    assert record["budget"]["trained_length"] == 32 and len(record["budget"]["variants"]) == 2
    assert record["text"]["source"] == str(texts) and record["text"]["bos_id"] == 2 and record["text"]["eos_id"] == 3
    assert sorted(p.name for p in out.iterdir()) == ["context.json", "context.npz", "context_loss_by_position.png",
                                                     "context_perplexity.png"]  # fmt: skip
    with np.load(record["npz"]) as z:
        assert z["position_loss"].shape == (2, 47) and z["perplexity"].shape == (2, 2)
        assert z["inv_freq"].shape == (2, 4) and z["variants"].tolist() == ["none", "yarn:2"]
        # the same 94 stream tokens at both lengths: 2 windows of 1 + 47, 7 of 1 + 15 (the BOS takes one of L; the
        # 7th window scores its first 4 tokens only)
        assert z["windows"].tolist() == [7, 2] and z["tokens"].tolist() == [94, 94]
        assert record["scored_tokens"] == {"16": 94, "48": 94}
        library = posprobe.context(str(folder), [16, 48], texts=texts.read_text().splitlines(), windows=2,
                                   rope_scaling="none,yarn:2")  # fmt: skip
        np.testing.assert_allclose(z["position_loss"], library.position_loss, rtol=1e-12)
    text = CliRunner().invoke(app, [*args[:-1], str(tmp_path / "t")])
    assert text.exit_code == 0 and "past the trained length" in text.output and "critical dimension" in text.output
    assert re.search(r"tokens scored\s+│?\s*94\s+│?\s*94", text.output), text.output  # the table's own row


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    import transformers as tf

    folder = tmp_path_factory.mktemp("ctx-gpt2")
    tokenizer = word_tokenizer(60)
    tokenizer.save_pretrained(folder)
    config = tf.GPT2Config(vocab_size=99, n_positions=32, n_embd=32, n_head=4, n_layer=2, eos_token_id=3)
    tf.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def test_learned_table_runs_without_variants(gpt2_folder, llama_folder):
    _, texts = llama_folder
    result = posprobe.context(str(gpt2_folder), [8, 32], texts=texts.read_text().splitlines(), windows=2)
    assert result.position_kind == "learned" and result.budget is None and result.inv_freq.shape == (1, 0)
    assert result.trained_length == 32 and np.isfinite(result.perplexity).all()


@pytest.mark.parametrize(
    "setup, args, message",
    [
        ("empty", [], "holds no texts"),
        ("short", [], "window(s) of 16 tokens, and --windows 4 were asked for"),
        (None, ["--lengths", "4000"], "window(s) of 4000 tokens"),
        (None, ["--windows", "0"], "--windows must be"),
        (None, ["--rope-scaling", "ntk:2"], "is not a variant"),
        (None, ["--rope-scaling", "yarn:0.5"], "needs a factor from 1 to"),
        (None, ["--rope-scaling", "longrope:4"], "short_factor / long_factor"),
        (None, ["--lengths", "1"], "--lengths must be"),
        ("gpt2", ["--rope-scaling", "none,linear:2"], "not rotary embeddings, so there is no rope to scale"),
        ("gpt2", ["--lengths", "64"], "learned table of 32 positions"),
        ("bert", [], "not a causal language model"),
    ],
)
def test_cli_context_bad_input(llama_folder, gpt2_folder, tiny_checkpoints, tmp_path, capsys, setup, args, message):
    from posprobe.cli import main

    folder, texts = llama_folder
    if setup == "empty":
        texts = tmp_path / "empty.txt"
        texts.write_text("\n\n")
    elif setup == "short":
        texts = tmp_path / "short.txt"
        texts.write_text("w1 w2 w3 w4 w5\n")
    elif setup == "gpt2":
        folder = gpt2_folder
    elif setup == "bert":
        folder = tiny_checkpoints["bert"]
    out = tmp_path / "never"
    base = ["--lengths", "16", "--windows", "4"] if "--lengths" not in args and "--windows" not in args else []
    with pytest.raises(SystemExit) as info:
        main(["context", str(folder), "--text", str(texts), *base, *args, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "\n" not in err and message in err, err
    assert not out.exists()


def test_library_refusals():
    model = tiny_llama()
    with pytest.raises(PosprobeError, match="exactly one of"):
        posprobe.context(model, [8])
    with pytest.raises(PosprobeError, match="carries no tokenizer"):
        posprobe.context(model, [8], texts=["a b c"])
    with pytest.raises(PosprobeError, match="no language-model head"):
        posprobe.context(model.model, [8], documents=documents())


def test_dynamic_changes_nothing_within_the_trained_length():
    """Dynamic NTK recomputes frequencies only past max_position_embeddings: within it (lengths <= 32 here) its loss
    is the unchanged model's, to the last bit; past it (48) it differs."""
    model, docs = tiny_llama(), documents(60)
    within = posprobe.context(model, [16, 32], documents=docs, windows=2, rope_scaling="none,dynamic:2")
    np.testing.assert_array_equal(within.position_loss[0], within.position_loss[1])
    past = posprobe.context(model, [48], documents=docs, windows=2, rope_scaling="none,dynamic:2")
    assert not np.allclose(past.position_loss[0, 32:], past.position_loss[1, 32:])


def test_alibi_runs_without_variants_and_refuses_them():
    """BLOOM (ALiBi): any length runs with 'none' (no position table, no budget); a rope variant is refused."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.BloomForCausalLM(tf.BloomConfig(vocab_size=99, hidden_size=32, n_layer=2, n_head=4)).eval()
    result = posprobe.context(model, [8, 40], documents=documents(), windows=2)
    assert result.position_kind == "alibi" and result.budget is None and result.inv_freq.shape == (1, 0)
    assert np.isfinite(result.position_loss).all() and result.windows.tolist() == [10, 2]
    with pytest.raises(PosprobeError, match="ALiBi attention biases, not rotary embeddings"):
        posprobe.context(model, [8], documents=documents(), rope_scaling="none,yarn:2")


def _stream_losses(model, stream, length, bos_id, covered):
    """{stream index s: -log p(stream[s] | what precedes it in its window)} for the windows of `length` that cover
    stream tokens 0..covered-1, each window run alone (an independent cut: window w holds stream tokens from
    w (L - b), after a BOS where there is one)."""
    b = int(bos_id is not None)
    losses, start = {}, 0
    with torch.no_grad():
        while start < covered:
            body = stream[start : start + length - b]
            ids = ([bos_id] if b else []) + body
            logp = torch.log_softmax(model(torch.as_tensor(ids)[None]).logits[0].double(), -1)
            for t in range(len(ids) - 1):  # logits at t predict ids[t + 1], stream token start + t + 1 - b
                losses[start + t + 1 - b] = -logp[t, ids[t + 1]].item()
            start += length - b
    return {s: v for s, v in losses.items() if s < covered}


@pytest.mark.parametrize("bos_id", [2, None], ids=["bos", "no-bos"])
def test_lengths_that_do_not_divide_the_longest_score_the_same_tokens(bos_id):
    """Issue 47: --lengths 384,1024 used to score 766 tokens at 384 against 1,023 at 1,024 (and, without a BOS,
    different tokens even where lengths divide). Now both perplexities are over exactly the same stream tokens:
    those every length predicts, brute-forced here from windows run one by one."""
    model, docs = tiny_llama(), documents(count=140, seed=3)
    lengths, windows = [384, 1024], 1
    result = posprobe.context(model, lengths, documents=docs, windows=windows, bos_id=bos_id)
    stream = [x for i, d in enumerate(docs) for x in ([3] if i else []) + d]
    covered = windows * (1024 - (bos_id is not None))
    per_length = [_stream_losses(model, stream, n, bos_id, covered) for n in lengths]
    common = sorted(set.intersection(*(set(x) for x in per_length)))
    expected = 1023 if bos_id is not None else 1024 - len({0, 384, 768})  # stream tokens 0..covered-1, less starts
    assert len(common) == expected and result.tokens.tolist() == [expected, expected]
    assert result.to_dict()["scored_tokens"] == {"384": expected, "1024": expected}
    for k, losses in enumerate(per_length):
        assert result.perplexity[0, k] == pytest.approx(math.exp(np.mean([losses[s] for s in common])), rel=1e-6)
    assert result.windows.tolist() == [3, 1]
    title = result.plot_perplexity()._suptitle.get_text()
    assert f"the same {expected:,} tokens scored at every length" in title
    assert "3 windows of 384, 1 window of 1,024" in title
    assert (bos_id is None) == ("window starts left out" in title) == ("less the" in result.note())


def test_without_a_bos_each_length_leaves_out_every_window_start():
    """No BOS, lengths 512/1024/2048 over 4,096 stream tokens: the 8 tokens at multiples of 512 start a window at
    some length, so no length scores them: 4,088 tokens at every length (not 4,096)."""
    from posprobe.analysis.context_loss import common_targets, target_mask

    common = common_targets(4096, [512, 1024, 2048], with_bos=False)
    assert common.sum() == 4088 and not common[::512].any()
    for n, count in ((512, 8), (1024, 4), (2048, 2)):
        mask = target_mask(common, n, count, with_bos=False)
        assert mask.sum() == 4088 and mask.shape == (count, n - 1)
    assert common_targets(4095, [512, 2048], with_bos=True).all()
    with_bos = target_mask(np.ones(10, dtype=bool), 4, 4, with_bos=True)  # windows of 1 + 3: the last holds 1
    assert with_bos.sum(1).tolist() == [3, 3, 3, 1]


def test_the_loss_figure_says_how_many_dots_lie_outside_its_axis():
    """The y axis follows the smoothed curves; every per-position dot outside it is counted in the title."""
    model, docs = tiny_llama(), documents()
    result = posprobe.context(model, [200], documents=docs, windows=2, bos_id=2)
    loss = result.position_loss.copy()
    loss[0, [150, 170]] = [50.0, -1.0]  # two dots that a smoothing bin of ~20 positions dilutes: outside the axis
    from dataclasses import replace

    figure = replace(result, position_loss=loss).plot()
    low, high = figure.axes[0].get_ylim()
    outside = int(((loss < low) | (loss > high)).sum())
    assert outside >= 2 and f"{outside:,} of {loss.size:,} dots lie outside the y axis" in figure._suptitle.get_text()
