"""Rotary frequency bands (SPEC §15): band norms equal those of the queries and keys the model itself computes
(hooked q/k projections, q/k norms), averaged over real tokens of padded batches; the per-band terms sum to the
content-free score; frequencies are the family's rotary module's (rope scaling included); non-rotary families are
refused in one line; the CLI writes the .npz / JSON / figure contract."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from family_models import build
from tiny_tokenizer import word_tokenizer

import posprobe
from posprobe.analysis.rotary_bands import band_norms, band_pairs, band_terms, frequencies_from_angles, wavelengths
from posprobe.errors import PosprobeError


def token_texts(count: int = 12, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 99, size=int(rng.integers(1, 10))).tolist() for _ in range(count)]


def hooked_queries_keys(model, family: str, ids: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer, the pre-rotation (q (H, T, d_h), k (H_kv, T, d_h)) of one text run alone, read from the model's
    own modules by forward hooks: q_proj / k_proj (Llama), q_norm / k_norm (Qwen3), the fused query_key_value
    (GPT-NeoX), q_layernorm / k_layernorm (Phi with qk_layernorm)."""
    cfg = model.config
    heads, dh = cfg.num_attention_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    seen: list[dict] = [dict() for _ in range(cfg.num_hidden_layers)]

    def keep(layer, name):
        def hook(module, args, out):
            seen[layer][name] = out.detach().double()

        return hook

    names = {"llama": ("q_proj", "k_proj"), "qwen3": ("q_norm", "k_norm"), "gpt_neox": ("query_key_value",),
             "phi": ("q_layernorm", "k_layernorm")}[family]  # fmt: skip
    handles = []
    for layer, block in enumerate(model.layers):
        attention = block.self_attn if hasattr(block, "self_attn") else block.attention
        for name in names:
            handles.append(getattr(attention, name).register_forward_hook(keep(layer, name)))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    out = []
    for got in seen:
        if family == "gpt_neox":  # (1, T, H * 3 d_h), per head [q; k; v]
            q, k, _ = got["query_key_value"][0].view(len(ids), heads, 3 * dh).chunk(3, dim=-1)
        elif family == "phi":  # (1, H, T, d_h) after the head split
            q, k = got["q_layernorm"][0].transpose(0, 1), got["k_layernorm"][0].transpose(0, 1)
        elif family == "qwen3":  # (1, T, H, d_h)
            q, k = got["q_norm"][0], got["k_norm"][0]
        else:  # (1, T, H d_h)
            q, k = (got[name][0].view(len(ids), -1, dh) for name in names)
        out.append((q.transpose(0, 1).numpy(), k.transpose(0, 1).numpy()))  # (H, T, d_h)
    return out


@pytest.mark.parametrize("family", ["llama", pytest.param("qwen3", marks=pytest.mark.slow),
                                    pytest.param("gpt_neox", marks=pytest.mark.slow),
                                    pytest.param("phi", marks=pytest.mark.slow)])  # fmt: skip
def test_band_norms_on_text_equal_the_models_own_queries_and_keys(family):
    """q_band_norm / k_band_norm with texts: the mean over real tokens (padded batches of 5) of the band norms of
    the queries and keys the model computes (hooked, each text alone); partial rotary bands only the rotated dims."""
    model = build(family)
    texts = token_texts()
    result = posprobe.rotary(model, input_ids=texts, batch_size=5)
    pairs = band_pairs(result.rotated_dims)
    sums = None
    for ids in texts:
        per_layer = hooked_queries_keys(model, family, ids)
        parts = [np.stack([band_norms(q, pairs).sum(1) for q, _ in per_layer]),
                 np.stack([band_norms(k, pairs).sum(1) for _, k in per_layer])]  # fmt: skip
        sums = parts if sums is None else [a + b for a, b in zip(sums, parts)]
    tokens = sum(len(t) for t in texts)
    assert result.texts["n_tokens"] == tokens and result.texts["n_texts"] == len(texts)
    np.testing.assert_allclose(result.q_band_norm, sums[0] / tokens, rtol=1e-6)
    np.testing.assert_allclose(result.k_band_norm, sums[1] / tokens, rtol=1e-6)
    cfg = model.config
    assert result.q_band_norm.shape == (2, cfg.num_attention_heads, result.rotated_dims // 2)
    assert result.partial == (family in ("gpt_neox", "phi"))
    if result.partial:
        assert np.all(result.q_unrotated_norm > 0) and "partial rotary" in result.note()
    else:
        assert np.all(result.q_unrotated_norm == 0)


@pytest.mark.parametrize("family", ["qwen2", pytest.param("llama", marks=pytest.mark.slow),
                                    pytest.param("gpt_neox", marks=pytest.mark.slow)])  # fmt: skip
def test_band_terms_sum_to_the_content_free_score(family):
    """SPEC §15: F̂(i, j) = scaling * (scale² * sum_f |q_f||k_f| cos(angle_f + (j - i) θ_f) + q_pass . k_pass),
    every head (grouped-query heads read their key head), every offset; Qwen2 with yarn (scale != 1)."""
    from posprobe.families.context import content_free_scores
    from posprobe.families.rotary import rotary_angles
    from posprobe.pipelines.score_reader import open_model

    model = build(family)
    ctx = open_model(model)
    n = 20
    cos, sin = rotary_angles(ctx, n)
    theta, scale = frequencies_from_angles(cos, sin)
    assert (scale != 1.0) == (family == "qwen2")
    pairs = band_pairs(cos.shape[-1])
    offsets = np.arange(-(n - 1), n)
    for layer in range(2):
        q, k = ctx.query_key(layer)  # (H, d_h), (H_kv, d_h)
        k = np.repeat(k, q.shape[0] // k.shape[0], axis=0)
        terms = band_terms(q, k, pairs, theta, offsets)  # (H, F, K)
        rest = (q * k).sum(-1) - (q[:, pairs.ravel()] * k[:, pairs.ravel()]).sum(-1)  # unrotated dims
        by_offset = ctx.scaling * (scale**2 * terms.sum(1) + rest[:, None])  # (H, K)
        scores = content_free_scores(ctx, layer, n)  # (H, n, n)
        i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        # the module's angles i θ_f are float32 products: equal to float32 precision, not to float64's
        np.testing.assert_allclose(scores, by_offset[:, (j - i) + n - 1], rtol=1e-5, atol=1e-6 * np.abs(scores).max())
        assert np.abs(scores - by_offset[:, (j - i) + n - 1]).max() < 1e-3 * np.ptp(scores)  # and far below the spread


def test_frequencies_are_the_rotary_modules():
    """Default rope: θ_f = base^(-2f/r); linear scaling by 2 halves every θ_f (Qwen3 test config); wavelengths are
    2π/θ_f; the yarn scale is the module's attention_scaling."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    mistral = posprobe.rotary(build("mistral"))  # rope_theta 500, head_dim 8
    expected = 500.0 ** (-np.arange(4) * 2 / 8)
    np.testing.assert_allclose(mistral.frequencies[0], expected, rtol=1e-6)
    np.testing.assert_allclose(mistral.wavelengths[0], 2 * np.pi / expected, rtol=1e-6)
    model = build("qwen3")  # head_dim 16, linear factor 2
    base = model.config.rope_parameters["rope_theta"]
    expected = base ** (-np.arange(8) * 2 / 16) / 2
    np.testing.assert_allclose(posprobe.rotary(model).frequencies[1], expected, rtol=1e-6)
    model = build("qwen2")
    assert posprobe.rotary(model).rotary_scale == pytest.approx(Qwen2RotaryEmbedding(model.config).attention_scaling)
    assert wavelengths(np.array([0.0]))[0] == np.inf


def test_interleaved_pairs_and_band_norms_known_answer():
    """Interleaved families pair (2f, 2f + 1): the permutation that orders even dims first gives those pairs; a
    band norm is the pair's 2-D norm."""
    order = np.concatenate([np.arange(0, 8, 2), np.arange(1, 8, 2)])
    assert band_pairs(8, order).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert band_pairs(8).tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    x = np.array([3.0, 0, 0, 0, 4.0, 1.0, 0, 0])
    np.testing.assert_allclose(band_norms(x, band_pairs(8)), [5.0, 1.0, 0, 0])


def test_non_rotary_families_are_refused_in_one_line(tiny_checkpoints):
    with pytest.raises(PosprobeError, match="learned absolute table, not rotary embeddings") as info:
        posprobe.rotary(str(tiny_checkpoints["bert"]))
    assert "posprobe toeplitz" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(PosprobeError, match="ALiBi attention biases, not rotary"):
        posprobe.rotary(build("bloom"))


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A tiny Llama checkpoint with an offline WordPiece tokenizer (any tokenizer with ids < 99 will do)."""
    folder = tmp_path_factory.mktemp("tiny-llama-tok")
    word_tokenizer(60).save_pretrained(folder)
    build("llama").save_pretrained(folder)
    texts = folder / "texts.txt"
    rng = np.random.default_rng(5)
    texts.write_text("".join(" ".join(f"w{x}" for x in rng.integers(0, 60, size=rng.integers(1, 9))) + "\n"
                             for _ in range(15)))  # fmt: skip
    return folder, texts


def test_cli_rotary_contract(llama_folder, tmp_path):
    from typer.testing import CliRunner

    from posprobe.cli import app

    folder, texts = llama_folder
    runner = CliRunner()
    result = runner.invoke(app, ["rotary", str(folder), "--text", str(texts), "--out", str(tmp_path / "r"), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["mode"] == "text" and record["texts"]["n_texts"] == 15 and record["texts"]["text"] == str(texts)
    assert record["rotated_dims"] == 8 and record["n_kv_heads"] == 2 and len(record["summary"]) == 2
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["rotary.npz", "rotary_bands.png"]
    with np.load(record["npz"]) as z:
        assert z["q_band_norm"].shape == (2, 4, 4) and z["k_band_norm"].shape == (2, 2, 4)
        assert z["frequencies"].shape == z["wavelengths"].shape == (2, 4)
        library = posprobe.rotary(str(folder), texts=texts.read_text().splitlines())
        np.testing.assert_allclose(z["q_band_norm"], library.q_band_norm, rtol=1e-10)
    plain = runner.invoke(app, ["rotary", str(folder), "--layers", "1", "--out", str(tmp_path / "c")])
    assert plain.exit_code == 0, plain.output
    assert "content-free" in plain.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--min-texts", "3"], "No such option"),
        (["--max-length", "8"], "--max-length applies only with --text"),
        (["--layers", "7"], "layer 7 does not exist"),
        (["--text", "missing.txt"], "does not exist"),
    ],
)
def test_cli_rotary_bad_input(llama_folder, tmp_path, capsys, args, message):
    from posprobe.cli import main

    folder, _ = llama_folder
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as info:
        main(["rotary", str(folder), *args, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "\n" not in err and message in err
    assert not out.exists()


def test_layer_types_get_their_own_frequencies():
    """Gemma 3: sliding layers rotate with their own base (100 here), full ones with 10000 and linear scaling by 2;
    closed forms theta_f = base^(-2f/d_h) / factor, per layer."""
    result = posprobe.rotary(build("gemma3_text"), positions=32)
    f = np.arange(4)  # head_dim 8: 4 bands
    np.testing.assert_allclose(result.frequencies[0], 100.0 ** (-2 * f / 8), rtol=1e-6)
    np.testing.assert_allclose(result.frequencies[1], 10000.0 ** (-2 * f / 8) / 2, rtol=1e-6)


@pytest.mark.slow
def test_stacks_run_one_after_another_get_their_own_frequencies():
    """BLT: its byte encoder (layers 0-1) rotates at base 100, its byte decoder (layers 3-5) at 1000, in interleaved
    pairs; its global transformer over patches (layer 2) has no bands (no positional score)."""
    result = posprobe.rotary(build("blt"), positions=16)
    f = np.arange(4)  # head_dim 8: 4 bands
    for layer, base in ((0, 100.0), (1, 100.0), (3, 1000.0), (5, 1000.0)):
        np.testing.assert_allclose(result.frequencies[layer], base ** (-2 * f / 8), rtol=1e-6)
        assert np.isfinite(result.q_band_norm[layer]).all()
    assert np.isnan(result.q_band_norm[2]).all()


def test_band_figure_has_one_legend_above_the_panels(llama_folder):
    """The legend sat inside layer 0's panel, over its lines: now one figure legend naming every line, the context
    lengths with their values, and no legend inside a panel."""
    folder, texts = llama_folder
    result = posprobe.rotary(str(folder), texts=texts.read_text().splitlines())
    fig = result.plot()
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:3] == ["each query head", "queries, mean over heads", "keys, mean over key heads"]
    assert labels[3:5] == [f"max positions ({result.max_positions:,})",
                          f"longest text ({result.texts['longest_text']:,} tokens)"]  # fmt: skip


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_default_rope_in_numpy_equals_the_rotary_module(family, monkeypatch):
    """Issue 49: the original RoPE of the Llama-like modules (`DEFAULT_ROPE_MODULES`) is computed in numpy, without
    importing torch or transformers: the same angles as the family's own module to within a float32 unit, at the
    config's base and at a layer's own base; configs that ask for anything else (scaling, partial rotary) still go
    to the module."""
    from transformers import AutoConfig

    from posprobe.families import rotary as R
    from posprobe.pipelines.score_reader import open_model

    config = AutoConfig.for_model(
        family, vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, max_position_embeddings=4096, rope_parameters={"rope_type": "default",
        "rope_theta": 50_000.0},
    )  # fmt: skip
    import transformers

    model = getattr(transformers, type(config).__name__.replace("Config", "Model"))(config)
    ctx = open_model(model)
    assert ctx.family.rotary_class in R.DEFAULT_ROPE_MODULES
    n = 3000
    for theta in (None, 1234.5):
        fast = R.default_rope_angles(ctx, n, None, theta)
        assert fast is not None
        with monkeypatch.context() as m:
            m.setattr(R, "default_rope_angles", lambda *args: None)
            slow = R.rotary_angles(ctx, n, None, theta)
        for ours, theirs in zip(fast, slow):
            assert ours.shape == theirs.shape == (n, 12)
            np.testing.assert_allclose(ours, theirs, rtol=0, atol=2.0**-23)
    ctx.config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 50_000.0}
    assert R.default_rope_angles(ctx, n) is None
    ctx.config["rope_parameters"] = {"rope_type": "default", "rope_theta": 50_000.0, "partial_rotary_factor": 0.5}
    assert R.default_rope_angles(ctx, n) is None
