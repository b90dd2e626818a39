"""Data-conditioned content-free scores (SPEC §13): `fhat` / `profiles` with texts equal what the model's own
attention computes when layer l is fed the mean hidden state entering it.

The reference is independent of posprobe's reader and capture: every text runs alone through the model with
`output_hidden_states`, the means are taken here, then the model itself runs with layer l's input replaced by them
(a forward pre-hook), and its attention function (transformers' AttentionInterface: the layer's own norm, Q/K
projections and biases, q/k norms, rotary module, eager scaling, soft cap) records the pre-softmax scores.
Families without AttentionInterface support (BLOOM) are compared through `output_attentions` (log-probabilities:
the scores up to a per-row constant on the causal pairs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import build_tiny
from family_models import _RECORDED, RECORD, _layers, _record, build
from tiny_tokenizer import word_tokenizer

import posprobe
from posprobe.errors import PosprobeError

N = 12


def tiny(family: str):
    return build_tiny(family).double() if family in ("bert", "gpt2", "albert") else build(family)


def token_texts(count: int = 30, seed: int = 0, longest: int = 14) -> list[list[int]]:
    """Token id sequences of 2..longest tokens (ids 3..98), so batches are padded and positions thin out."""
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 99, size=int(rng.integers(2, longest + 1))).tolist() for _ in range(count)]


def reference_means(model, texts, layer: int, per_position: bool, min_texts: int = 1) -> np.ndarray:
    """SPEC §13 by brute force: (d,) mean of hidden_states[layer] over tokens at positions >= 1 of every text, or
    (P, d) per position over the texts that reach it, for the leading positions with at least `min_texts` texts."""
    with torch.no_grad():
        states = [
            model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[layer][0].double().numpy()
            for ids in texts
        ]
    if not per_position:
        return np.concatenate([h[1:] for h in states]).mean(0)
    rows = []
    for i in range(max(len(h) for h in states)):
        at = [h[i] for h in states if len(h) > i]
        if len(at) < min_texts:
            break
        rows.append(np.mean(at, axis=0))
    return np.stack(rows)


def scores_with_input(model, layer: int, x: np.ndarray, n: int) -> tuple[np.ndarray, bool]:
    """(H, n, n) pre-softmax scores of `layer` when its input is `x` ((d,) at every position, or (n, d)), from the
    model's own attention; and whether they are exact (else log-probabilities, equal up to a row constant)."""
    from transformers import AttentionInterface

    rows = torch.from_numpy(np.broadcast_to(x, (n, x.shape[-1])).copy()).to(model.dtype)[None]

    def hook(module, args, kwargs):
        if args:
            return (rows, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": rows}

    groups = getattr(getattr(model, "encoder", None), "albert_layer_groups", None)
    module = groups[0] if groups is not None else _layers(model)[layer]  # ALBERT: one shared layer, every depth
    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    exact = bool(getattr(type(model), "_supports_attention_backend", False))
    AttentionInterface.register(RECORD, _record)
    try:
        _RECORDED.clear()
        if exact:
            model.set_attn_implementation(RECORD)
        with torch.no_grad():
            out = model(input_ids=torch.full((1, n), 5), output_attentions=not exact)
        if exact:
            return _RECORDED[layer][0], True  # (pre-mask scores, mask)
        with np.errstate(divide="ignore"):
            return np.log(out.attentions[layer][0].double().numpy()), False
    finally:
        handle.remove()
        model.set_attn_implementation("eager")


def assert_scores_equal(ours: np.ndarray, theirs: np.ndarray, exact: bool) -> None:
    if exact:
        # float32 inside some modules (RMSNorm variance, rotary angles): as in the SPEC §9 parity tests
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6 * np.abs(theirs).max())
    else:  # log-probabilities on the causal pairs: equal up to a per-row constant
        n = ours.shape[-1]
        diff = np.where(np.tril(np.ones((n, n), dtype=bool)), ours - theirs, np.nan)
        assert np.nanmax(np.nanmax(diff, -1) - np.nanmin(diff, -1)) < 1e-5


# Llama with GQA, Qwen3 with q/k norms, GPT-NeoX and Phi with partial rotary (Phi: q/k LayerNorm), BLOOM (ALiBi,
# no AttentionInterface), BERT / GPT-2 (learned tables, post- and pre-LN), ALBERT (one layer's weights at every
# depth, a different input at each). Layers 0 and 1 of each. The default run keeps two; the rest run with -m slow.
FAST = {"mean": "llama", "position-mean": "gpt2"}
FAMILIES = ["llama", "qwen3", "gpt_neox", "phi", "bloom", "bert", "gpt2", "albert"]


def families(input: str) -> list:
    return [f if f == FAST[input] else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES]


@pytest.mark.parametrize("family", families("mean"))
def test_mean_input_scores_equal_the_models_attention(family):
    """'mean': fhat of every layer equals the model's own scores of x_l; rotary / ALiBi scores are Toeplitz by
    construction; an absolute table's are one number per head (the table is averaged away), and the note says so."""
    model = tiny(family)
    texts = token_texts()
    for layer in (0, 1):
        result = posprobe.fhat(model, layer=layer, positions=N, input_ids=texts, batch_size=7, input="mean")
        assert result.mode == "data-conditioned" and result.conditioning["input"] == "mean"
        assert result.conditioning["n_texts"] == len(texts)
        assert result.conditioning["n_tokens"] == sum(len(t) - 1 for t in texts)
        x = reference_means(model, texts, layer, per_position=False)
        theirs, exact = scores_with_input(model, layer, x, N)
        assert_scores_equal(result.matrices, theirs, exact)
        assert result.toeplitz_by_construction and np.isnan(result.toeplitz_r2).all()
    if family in ("bert", "gpt2", "albert"):  # the table entered only through x_l: every score of a head equal
        spread = result.matrices.max((1, 2)) - result.matrices.min((1, 2))
        assert np.all(spread <= 1e-9 * np.abs(result.matrices).max())
        assert "position-mean" in result.conditioning["note"]
    else:
        assert np.ptp(result.matrices[:, -1, :]) > 1e-6  # scores still vary with k


@pytest.mark.parametrize("family", families("position-mean"))
def test_position_mean_scores_equal_the_model_and_are_not_toeplitz(family):
    """'position-mean': profiles (every layer) come from F̂ equal to the model's scores of x_l(i), i = 0..P-1, with
    P the leading positions with at least min_texts texts; with position-dependent inputs the matrices are not
    Toeplitz, and their R² is measured."""
    model = tiny(family)
    texts = token_texts(seed=1)
    result = posprobe.profiles(model, input_ids=texts, input="position-mean", min_texts=5, batch_size=4)
    assert result.mode == "data-conditioned" and not result.toeplitz_by_construction
    for layer in (0, 1):
        x = reference_means(model, texts, layer, per_position=True, min_texts=5)
        n = x.shape[0]
        assert result.n_positions == n and result.conditioning["texts_at"][-1] >= 5
        theirs, exact = scores_with_input(model, layer, x, n)
        # the batching of `profiles`: the same captured hidden states, so its profile is F̂'s diagonal means exactly
        fhat = posprobe.fhat(model, layer=layer, input_ids=texts, input="position-mean", min_texts=5, batch_size=4)
        assert_scores_equal(fhat.matrices, theirs, exact)
        from posprobe.analysis.toeplitz import diagonal_means

        np.testing.assert_allclose(result.profile(layer, 0), diagonal_means(fhat.matrices)[0], rtol=1e-12)
        # Another batching changes x_l (l >= 1) by float32 rounding, not float64: transformers' eager attention
        # (and BLOOM's) takes softmax in float32 even for a float64 model, and its rounding depends on the padded
        # row length (torch on AVX2: rows shorter than 8 take another kernel path, 1 float32 ulp apart), so layer
        # 0's output moves by ~1e-8 relative (Qwen3 on an AMD EPYC: 3e-9 of max |F̂|; 4e-16 with the softmax in
        # float64). Bounded as the oracle is: float32 precision of the matrices' scale.
        other = posprobe.fhat(model, layer=layer, input_ids=texts, input="position-mean", min_texts=5)
        np.testing.assert_allclose(other.matrices, fhat.matrices, rtol=0, atol=1e-6 * np.abs(fhat.matrices).max())
        r2 = result.fhat_r2[result.layer_index(layer)]
        assert np.isfinite(r2).all() and r2.max() < 1 - 1e-6  # measured, and not Toeplitz
        # the tokens averaged into x_l(0..n-1): those of the analysed positions, not every real token
        assert result.conditioning["n_tokens"] == sum(min(len(t), n) for t in texts) < sum(len(t) for t in texts)
        assert fhat.conditioning["n_tokens"] == result.conditioning["n_tokens"]


def test_float64_throughout_but_for_the_models_float32_softmax(monkeypatch):
    """posprobe keeps float64 from the model's hidden states to F̂: with the model's one batching-dependent float32
    step (transformers' eager softmax, `dtype=torch.float32`) run in float64, the means posprobe averages equal the
    brute-force ones (every text alone) to float64 precision, and two batchings give the same scores (as they are,
    ~1e-8 relative apart: see the position-mean test). Qwen3, the family it moved most."""
    from posprobe.pipelines.data_conditioned import hidden_means, text_settings

    softmax = torch.nn.functional.softmax

    def float64_softmax(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", float64_softmax)
    model, texts = build("qwen3"), token_texts(seed=1)
    assert model.dtype == torch.float64
    for input in ("mean", "position-mean"):
        per_position = input == "position-mean"
        x = reference_means(model, texts, 1, per_position=per_position, min_texts=5)
        for size in (4, 32):
            settings = text_settings(input_ids=texts, input=input, min_texts=5, batch_size=size)
            ours = hidden_means(model, [1], settings, allow_pickle=False)[0].layer(1)
            ours = ours[: len(x)] if per_position else ours
            np.testing.assert_allclose(ours, x, rtol=0, atol=1e-13 * np.abs(x).max())
        one, other = (
            posprobe.fhat(model, layer=1, positions=8, input_ids=texts, input=input, min_texts=5, batch_size=size)
            for size in (4, 32)
        )
        np.testing.assert_allclose(one.matrices, other.matrices, rtol=0, atol=1e-13 * np.abs(one.matrices).max())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mpnet", "deberta-v3", "deberta-v2"])
def test_bucket_bias_and_disentangled_families(name):
    """MPNet (absolute table + bucket bias) and DeBERTa-v2/v3 (with and without an absolute input), which have no
    AttentionInterface: their log-probabilities given x_l equal ours up to a per-row constant, for both inputs; a
    data-conditioned mean holds any absolute table, so only the relative terms vary: Toeplitz by construction."""
    from test_by_construction import _bias_model

    model = _bias_model(name).double()
    texts = token_texts(count=20, longest=10)
    for input in ("mean", "position-mean"):
        per_position = input == "position-mean"
        positions = None if per_position else 8
        result = posprobe.fhat(model, layer=1, positions=positions, input_ids=texts, input=input, min_texts=4)
        x = reference_means(model, texts, 1, per_position=per_position, min_texts=4)
        theirs, exact = scores_with_input(model, 1, x, result.matrices.shape[-1])
        assert not exact
        diff = result.matrices - theirs  # every pair allowed (encoders): a constant per row
        assert np.max(np.abs(diff - diff.mean(-1, keepdims=True))) < 1e-9
        assert result.toeplitz_by_construction == (not per_position)


def test_model_folder_and_texts_through_the_tokenizer(tmp_path):
    """A saved checkpoint with a tokenizer: texts (strings) are tokenised as `attention` tokenises them, and the
    scores are the same as for the same tokens passed as ids."""
    tokenizer = word_tokenizer(60)
    tokenizer.save_pretrained(tmp_path)
    build_tiny("bert").save_pretrained(tmp_path)
    rng = np.random.default_rng(3)
    texts = [" ".join(f"w{x}" for x in rng.integers(0, 60, size=rng.integers(1, 9))) for _ in range(20)]
    by_text = posprobe.profiles(str(tmp_path), texts=texts, input="position-mean", min_texts=3, layers=[1])
    ids = [tokenizer(t)["input_ids"] for t in texts]
    by_ids = posprobe.profiles(str(tmp_path), input_ids=ids, input="position-mean", min_texts=3, layers=[1])
    np.testing.assert_allclose(by_text.profiles, by_ids.profiles, rtol=1e-6)
    assert by_text.conditioning["n_texts"] == 20 and by_text.n_positions == by_ids.n_positions


def test_bad_settings_are_one_clear_error():
    model = tiny("llama")
    texts = token_texts(count=6, longest=4)
    with pytest.raises(PosprobeError, match="unknown input 'median'"):
        posprobe.fhat(model, input_ids=texts, input="median")
    with pytest.raises(PosprobeError, match="applies to data-conditioned scores"):
        posprobe.fhat(model, input="position-mean")
    with pytest.raises(PosprobeError, match="min_texts must be at least 1"):
        posprobe.fhat(model, input_ids=texts, min_texts=0)
    with pytest.raises(PosprobeError, match="only 0 position.s. have at least min_texts=16 texts"):  # 6 texts
        posprobe.fhat(model, input_ids=texts, input="position-mean")
    with pytest.raises(PosprobeError, match="do not fit the texts"):
        posprobe.fhat(model, input_ids=texts, input="position-mean", min_texts=1, positions=10)
    with pytest.raises(PosprobeError, match="no token after the first"):
        posprobe.fhat(model, input_ids=[[5], [6]])
    with pytest.raises(PosprobeError, match="one string"):
        posprobe.fhat(model, texts="a text")


def test_encoder_decoders_are_refused_with_one_line():
    with pytest.raises(PosprobeError, match="encoder-decoder") as info:
        posprobe.fhat(build("marian"), input_ids=token_texts(count=4))
    assert "\n" not in str(info.value)


# -- the CLI ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert_with_texts(tmp_path_factory):
    """A tiny BERT checkpoint with an offline WordPiece tokenizer, and 30 texts in a .jsonl file."""
    import json

    folder = tmp_path_factory.mktemp("tiny-bert-texts")
    word_tokenizer(60).save_pretrained(folder)
    build_tiny("bert").save_pretrained(folder)
    rng = np.random.default_rng(7)
    rows = [{"sentence": " ".join(f"w{x}" for x in rng.integers(0, 60, size=rng.integers(1, 12)))} for _ in range(30)]
    texts = folder / "texts.jsonl"
    texts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder, texts


def test_cli_profiles_and_fhat_with_text(bert_with_texts, tmp_path):
    """--text makes `profiles` / `fhat` data-conditioned: the JSON says so (mode, conditioning with the text
    file), the .npz keeps its contract, file names carry the input, and the numbers are the library's."""
    import json

    from typer.testing import CliRunner

    from posprobe.cli import app

    folder, texts = bert_with_texts
    args = [str(folder), "--text", str(texts), "--column", "sentence", "--input", "position-mean", "--min-texts", "5"]
    result = CliRunner().invoke(app, ["profiles", *args, "--out", str(tmp_path / "p"), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["mode"] == "data-conditioned" and record["toeplitz_by_construction"] is False
    c = record["conditioning"]
    assert c["input"] == "position-mean" and c["text"] == str(texts) and c["n_texts"] == 30 and c["min_texts"] == 5
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [
        "profiles_data-conditioned-position-mean.npz",
        "profiles_layer0_data-conditioned-position-mean.png",
        "profiles_layer1_data-conditioned-position-mean.png",
    ]
    n = record["n_positions"]
    with np.load(record["npz"]) as z:
        assert z["profiles"].shape == (2, 4, 2 * n - 1) and z["fhat_r2"].shape == (2, 4)
        lines = (folder / "texts.jsonl").read_text().splitlines()
        library = posprobe.profiles(
            str(folder), texts=[json.loads(x)["sentence"] for x in lines], input="position-mean", min_texts=5
        )
        np.testing.assert_allclose(z["profiles"], library.profiles, rtol=1e-10)
    mean = [*args[:5], "--input", "mean"]  # not the default for a table model (constant by construction), asked for
    result = CliRunner().invoke(app, ["fhat", *mean, "--layer", "1", "--out", str(tmp_path / "f"), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["mode"] == "data-conditioned" and record["conditioning"]["input"] == "mean"
    assert record["toeplitz_by_construction"] is True and "position-mean" in record["conditioning"]["note"]
    assert record["figure"].endswith("fhat_layer1_data-conditioned.png")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--input", "position-mean"], "--input applies only with --text"),
        (["--max-length", "16"], "--max-length applies only with --text"),
        (["--text", "missing.txt"], "does not exist"),
        (["--text", "{texts}"], "--column"),
        (["--text", "{texts}", "--column", "sentence", "--min-texts", "0"], "--min-texts must be at least 1"),
        (["--text", "{texts}", "--column", "sentence", "--max-length", "1"], "--max-length must be at least 2"),
        (["--text", "{texts}", "--column", "sentence", "--input", "position-mean", "--positions", "40"],
         "do not fit the texts"),
    ],
)  # fmt: skip
def test_cli_bad_text_options_one_line_nothing_written(bert_with_texts, tmp_path, capsys, extra, message):
    from posprobe.cli import main

    folder, texts = bert_with_texts
    extra = [e.replace("{texts}", str(texts)) for e in extra]
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as info:
        main(["profiles", str(folder), *extra, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and err.startswith("posprobe: error: ") and "\n" not in err
    assert message in err
    assert not out.exists()


def test_flat_profiles_have_no_peak_and_are_drawn_flat():
    """With input 'mean' an absolute table is averaged away: every score of a head is one number, up to round-off
    (~1e-17). Such a profile has no peak (None in JSON, '—' in text, NaN in `peak_offsets`), and its figure does
    not magnify the round-off into a shape (the profile is drawn as a straight line; the sections, equal to it by
    construction, are not drawn)."""
    from posprobe.plotting.profiles import profile_pages

    result = posprobe.profiles(tiny("bert"), layers=[0], positions=N, window=5, input_ids=token_texts(), input="mean")
    window = result.profiles[..., N - 1 - 5 : N + 5]
    assert np.ptp(window, axis=-1).max() <= 1e-12 * np.abs(window).max()  # flat up to round-off
    assert np.isnan(result.peak_offsets()).all()
    assert all(h["peak_offset"] is None for h in result.to_dict()["heads"])
    pages = profile_pages(result)
    pages.figure(0)
    for line in pages._profile.get_segments():
        assert np.ptp(line[:, 1]) < 1e-9  # inches: a straight line
    assert result.toeplitz_by_construction and pages.sections is None and not pages._sections.get_segments()


def test_hidden_means_ignore_non_finite_padding_and_refuse_non_finite_real_tokens():
    """Padding may hold NaN or inf (transformers' eager attention gives NaN rows to padding queries that a sliding
    window leaves without a key, in float64): the means are over real tokens only, so such padding must not reach
    them (0 * NaN is NaN). NaN on a real token is one clear error, not NaN scores."""
    from types import SimpleNamespace

    from posprobe.analysis.hidden_means import HiddenMeanAccumulator
    from posprobe.analysis.positional_vectors import PositionalVectorAccumulator

    rng = np.random.default_rng(0)
    real = torch.tensor([[True] * 5, [True] * 2 + [False] * 3])
    hidden = torch.from_numpy(rng.normal(size=(2, 5, 4)))
    padded = hidden.clone()
    padded[1, 2:] = float("nan")
    padded[1, 3, 0] = float("inf")
    batch = SimpleNamespace(real=real, hidden_states=(padded, padded))
    tokens = [hidden[0].numpy(), hidden[1, :2].numpy()]
    for input, expected in [
        ("mean", np.concatenate([t[1:] for t in tokens]).mean(0)),
        ("position-mean", np.stack([np.mean([t[i] for t in tokens if len(t) > i], 0) for i in range(5)])),
    ]:
        acc = HiddenMeanAccumulator([1], input, 5)
        acc.add(batch)
        np.testing.assert_allclose(acc.result().layer(1), expected, rtol=1e-12)
    vectors = PositionalVectorAccumulator(2, 5, 4)
    vectors.add(batch)
    means = np.stack([np.mean([t[i] for t in tokens if len(t) > i], 0) for i in range(5)])
    np.testing.assert_allclose(vectors.result(min_texts=1).vectors[1], means - means.mean(0), rtol=1e-12)
    padded[0, 1, 2] = float("nan")
    with pytest.raises(PosprobeError, match="NaN or infinite values on real tokens"):
        HiddenMeanAccumulator([0], "mean", 5).add(batch)


def test_titles_say_how_many_texts_and_which_input():
    """A data-conditioned figure names its texts and input, as its JSON does (`conditioning`)."""
    from posprobe.plotting.profiles import profile_pages

    model = build_tiny("bert")
    ids = [[2, 5, 6, 7, 8, 3]] * 4
    p = posprobe.profiles(model, layers=[1], input_ids=ids, input="position-mean", min_texts=2)
    assert "data-conditioned mode on 4 texts (position-mean input)" in profile_pages(p).page_titles[0]
    f = posprobe.fhat(model, layer=1, input_ids=ids, input="mean")
    assert "data-conditioned mode on 4 texts (mean input)" in f.plot().title
    plain = posprobe.profiles(model, layers=[1])
    assert " texts (" not in profile_pages(plain).page_titles[0]


def test_layer_inputs_are_an_argument_not_state_of_the_reader():
    """Issue 30: the model reader holds no data-conditioned state. Scores of layer inputs are computed from the
    `LayerInputs` handed to them; the same reader's embedding-level scores before and after are identical, the
    memo it keeps (rotary angles, layer kinds) changes no result (a fresh reader gives the same numbers), and the
    inputs are a read-only copy (changing the caller's array later changes nothing). Reference: the model's own
    attention with layer l fed x_l, as in the tests above."""
    from posprobe.families.context import LayerInputs, ModelContext, content_free_scores
    from posprobe.pipelines.score_reader import ScoreReader, open_model

    model = tiny("llama")
    texts = token_texts()
    x = reference_means(model, texts, 1, per_position=False)
    ctx = open_model(model)
    before = content_free_scores(ctx, 1, N)
    given = x.copy()
    inputs = ctx.layer_inputs({1: given})
    conditioned = content_free_scores(ctx, 1, N, inputs=inputs)
    given[:] = 0  # the caller's array changes; the inputs do not
    theirs, exact = scores_with_input(model, 1, x, N)
    assert_scores_equal(conditioned, theirs, exact)
    np.testing.assert_array_equal(content_free_scores(ctx, 1, N, inputs=inputs), conditioned)
    np.testing.assert_array_equal(content_free_scores(ctx, 1, N), before)  # nothing was left behind
    fresh = open_model(model)
    np.testing.assert_array_equal(content_free_scores(fresh, 1, N, inputs=fresh.layer_inputs({1: x})), conditioned)
    assert not hasattr(ctx, "use_layer_inputs") and not hasattr(ModelContext, "conditioned")
    assert isinstance(inputs, LayerInputs) and not inputs.rows[1].flags.writeable and not inputs.per_position
    with pytest.raises(ValueError, match="d = "):
        ctx.layer_inputs({1: np.zeros(ctx.shape.hidden + 1)})
    plain, fed = ScoreReader(ctx, N), ScoreReader(ctx, N, inputs=inputs)  # two readers of one context coexist
    assert (plain.mode, fed.mode) == ("content-free", "data-conditioned")
    np.testing.assert_array_equal(plain.scores(1), before)
    np.testing.assert_array_equal(fed.scores(1), conditioned)
    q, k = ctx.query_key_of(np.stack([x, x]), 1)  # hidden states of real tokens: also no state written
    np.testing.assert_allclose(q[:, 0], ctx.query_key(1, inputs=inputs)[0], rtol=1e-12)
    np.testing.assert_array_equal(content_free_scores(ctx, 1, N), before)


@pytest.mark.slow
def test_a_layer_reusing_keys_is_conditioned_on_its_source_layers_input_too():
    """Gemma 4 (issue 34): layer 3 attends to the keys layer 1 computes, so its 'mean' scores are the model's own
    when layer 1 is fed the mean hidden state entering it and layer 3 the one entering layer 3; reading layer 3's
    keys from its own input instead would differ."""
    from transformers import AttentionInterface

    model = build("gemma4_text", torch.float32)  # float64 Gemma 4 gives NaN where a window meets padding
    texts = token_texts()
    result = posprobe.fhat(model, layer=3, positions=N, input_ids=texts, batch_size=7, input="mean")
    means = {layer: reference_means(model, texts, layer, per_position=False) for layer in (1, 3)}
    assert np.abs(means[1] - means[3]).max() > 1e-3  # the two inputs differ

    def feed(rows):
        def hook(module, args, kwargs):
            return ((rows, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": rows})

        return hook

    rows = {layer: torch.from_numpy(np.broadcast_to(x, (N, x.shape[-1])).copy()).float()[None]
            for layer, x in means.items()}  # fmt: skip
    handles = [_layers(model)[layer].register_forward_pre_hook(feed(rows[layer]), with_kwargs=True) for layer in rows]
    AttentionInterface.register(RECORD, _record)
    try:
        _RECORDED.clear()
        model.set_attn_implementation(RECORD)
        with torch.no_grad():
            model(input_ids=torch.full((1, N), 5))
        theirs = _RECORDED[3][0]
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation("eager")
    assert_scores_equal(result.matrices, theirs, exact=True)
