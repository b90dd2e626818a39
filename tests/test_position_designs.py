"""The newest position designs (issue 34), each against a known answer or a brute-force loop on a tiny random model:

- a NoPE layer (SmolLM3's no_rope_layers, Cohere 2's global layers) has one content-free score for every pair
  (SPEC §9): F̂ = q . k * scaling of the average word, its profile flat, its Toeplitz R² undefined (not a fake 1),
  and the model's own softmax on the constant sequence is uniform over the keys each query may see;
- a learned per-head sink (gpt-oss) takes exp(s_h) / (exp(s_h) + sum_j exp(S(i, j))) of each query's attention:
  `attention` reports that share and the share left to real tokens, and multiplies the first-token mass by it;
- multi-head latent attention (DeepSeek V3) splits every head's score into a position-free part (q_pass . k_pass,
  one constant) and a rotary part: zeroing either part's weights leaves the other, and the two add to F̂;
- a hybrid (LFM2: convolutions between attention layers) has its attention layers analysed, from its weights and on
  text, and its other layers listed with their kind and no positional score (NaN) in the text table, JSON and figure
  titles (`attention` on text against loops: tests/test_capture_families.py); `states` covers every layer;
- model types with no softmax attention at all (Mamba, RWKV, xLSTM) are refused in one line that says why.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from family_models import build

import posprobe
from posprobe.analysis.learned_sinks import LearnedSinkAccumulator, content_free_sink_share
from posprobe.capture import capture
from posprobe.checkpoint import WeightReader, resolve_model
from posprobe.errors import PosprobeError
from posprobe.families.context import ModelContext, content_free_scores

N = 12


def _context(path) -> ModelContext:
    source = resolve_model(str(path))
    return ModelContext(source, WeightReader(source.path, source.weight_format), mode="faithful")


def _average_word_qk(model, layer: int):
    """Brute force from the model's own modules: q, k (H, d_h) of the average word entering `layer`'s attention
    (its input norm, projections; grouped-query key heads repeated)."""
    inner = model.model if hasattr(model, "model") else model
    block = inner.layers[layer]
    x = inner.embed_tokens.weight.mean(0)
    with torch.no_grad():
        h = block.input_layernorm(x[None])[0]
        q = block.self_attn.q_proj(h).reshape(model.config.num_attention_heads, -1)
        k = block.self_attn.k_proj(h).reshape(model.config.num_key_value_heads, -1)
    return q.double().numpy(), np.repeat(k.double().numpy(), q.shape[0] // k.shape[0], axis=0)


def test_a_nope_layers_content_free_score_is_one_constant_and_its_profile_flat(tmp_path):
    model = build("smollm3")  # no_rope_layers [1, 0]: layer 0 rotary, layer 1 NoPE
    model.save_pretrained(tmp_path)
    ctx = _context(tmp_path)
    kinds = ctx.layer_kinds(N)
    assert [k.nope for k in kinds] == [False, True] and "NoPE" in kinds[1].describe()
    scores = content_free_scores(ctx, 1, N)  # (H, N, N)
    q, k = _average_word_qk(model, 1)
    expected = (q * k).sum(-1) * q.shape[-1] ** -0.5  # one value per head
    np.testing.assert_allclose(scores, np.broadcast_to(expected[:, None, None], scores.shape), rtol=1e-6)
    rotary = content_free_scores(ctx, 0, N)
    assert np.ptp(rotary[:, -1, :], axis=-1).min() > 1e-4  # the rotary layer's last query row varies with the key

    result = posprobe.profiles(str(tmp_path), layers="all", positions=N)
    nope = result.layer_index(1)
    np.testing.assert_allclose(
        result.profiles[nope], np.broadcast_to(expected[:, None], result.profiles[nope].shape), rtol=1e-6
    )
    assert np.isnan(result.fhat_r2[nope]).all()  # measured nothing: no fake R² = 1
    assert np.isnan(result.peak_offsets()[nope]).all()  # a flat profile has no peak
    record = json.loads(json.dumps(result.metadata()))
    assert "NoPE" in record["layer_kinds"][1] and "NoPE" not in record["layer_kinds"][0]


def test_a_nope_layer_attends_uniformly_on_the_constant_sequence():
    """The model's own probabilities at a NoPE layer (layer 0 of `smollm3-sliding`: NoPE and a window of 12)
    on the constant sequence of one token: 1 / (number of keys the query may see), causal and windowed."""
    model = build("smollm3-sliding")
    n = 16
    assert model.config.no_rope_layers[0] == 0 and model.config.layer_types[0] == "sliding_attention"
    with torch.no_grad():
        attentions = model(input_ids=torch.full((1, n), 7), output_attentions=True).attentions
    probs, probs_rotary = (a[0].double().numpy() for a in attentions)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    seen = (j <= i) & (i - j < 12)
    expected = np.where(seen, 1.0 / seen.sum(-1, keepdims=True), 0.0)
    np.testing.assert_allclose(probs, np.broadcast_to(expected, probs.shape), atol=1e-12)
    assert not np.allclose(probs_rotary, np.broadcast_to(expected, probs.shape))


def test_llama4_nope_layers_scale_each_query_by_its_temperature_and_rotary_layers_attend_in_chunks(tmp_path):
    """Llama 4: a NoPE layer's F̂(i, j) = t(i) q.k scaling, t(i) = 1 + attn_scale log(1 + floor((i + 1) /
    floor_scale)) (here floor_scale 4, attn_scale 0.5): no longer Toeplitz, and said so; its rotary layers attend
    within chunks of attention_chunk_size (12)."""
    build("llama4_text").save_pretrained(tmp_path)
    ctx = _context(tmp_path)
    n = 16
    kinds = ctx.layer_kinds(n)
    assert kinds[0].attention == "chunked" and kinds[0].chunk == 12 and "chunks of 12" in kinds[0].describe()
    assert kinds[0].allowed(n)[11, 0] and not kinds[0].allowed(n)[12, 11] and kinds[1].nope
    scores = content_free_scores(ctx, 1, n)
    t = 1 + 0.5 * np.log1p(np.floor((np.arange(n) + 1) / 4))
    np.testing.assert_allclose(scores / scores[:, :1, :1], np.broadcast_to(t[None, :, None], scores.shape), rtol=1e-6)
    assert not posprobe.fhat(str(tmp_path), layer=1, positions=n).toeplitz_by_construction


def test_cohere2_global_layers_are_nope_and_its_windowed_layers_rotate(tmp_path):
    model = build("cohere2")
    model.save_pretrained(tmp_path)
    kinds = _context(tmp_path).layer_kinds(N)
    assert [(k.attention, k.nope) for k in kinds] == [("local", False), ("full", True)]


def _gpt_oss(sinks: list[float]):
    model = build("gpt_oss")
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.sinks.copy_(torch.tensor(sinks, dtype=layer.self_attn.sinks.dtype))
    return model


def _eager_probs(model, ids: list[int]) -> list[np.ndarray]:
    """The model's own eager attention on one text: (H, n, n) per layer, the sink column dropped by the model."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    return [a[0].double().numpy() for a in out.attentions]


def test_learned_sinks_take_their_share_and_leave_the_rest_to_real_tokens():
    texts = [[5, 9, 13, 40, 41, 7], [11, 12, 60, 61, 62, 63, 64, 9, 8], [70, 71, 72]]
    model = _gpt_oss([4.0, -30.0, 0.0, 1.5])  # head 1: no sink (exp(-30) ~ 0)
    acc = LearnedSinkAccumulator(2, 4)
    capture(model, [acc], input_ids=texts, max_length=16, batch_size=2)
    got = acc.result()
    rows = [[1.0 - p.sum(-1) for p in _eager_probs(model, ids)] for ids in texts]  # per text: (H, n) per layer
    expected = np.stack([np.concatenate([r[layer] for r in rows], -1).mean(-1) for layer in range(2)])  # (L, H)
    np.testing.assert_allclose(got.learned_sink_share, expected, atol=1e-6)
    np.testing.assert_allclose(got.learned_sink_share + got.real_token_share, 1.0)
    assert got.n_queries == sum(map(len, texts))
    assert (np.abs(got.learned_sink_share[:, 1]) < 1e-6).all() and (got.learned_sink_share[:, 0] > 0.5).all()


def test_a_learned_sink_scales_first_token_mass_by_the_share_left_to_real_tokens():
    """Layer 0 sees the same input whatever the sinks: with sinks, A(i, 0) is A(i, 0) without them times the
    share each query leaves to real tokens; `attention` reports both shares in separate fields."""
    ids = [[5, 9, 13, 40, 41, 7, 30, 31]]
    without = _eager_probs(_gpt_oss([-30.0] * 4), ids[0])[0]
    model = _gpt_oss([3.0, 1.0, -1.0, -30.0])
    with_sinks = _eager_probs(model, ids[0])[0]
    real_share = with_sinks.sum(-1)  # (H, n)
    # 1e-7: transformers' eager softmax runs in float32 even in float64 models, and the CPU's float32 kernel may
    # round the two softmaxes (one column more with sinks) apart by a few units in their last place (AVX2: 1.2e-8)
    np.testing.assert_allclose(with_sinks[..., 0], without[..., 0] * real_share, atol=1e-7)
    result = posprobe.attention_profiles(model, input_ids=ids, max_length=8, weights_correlation=False)
    first = with_sinks[:, 1:, 0].mean(-1)  # SPEC §14: queries i >= 1
    np.testing.assert_allclose(result.first_token_mass[0], first, atol=1e-6)
    np.testing.assert_allclose(result.learned_sinks.real_token_share[0], real_share.mean(-1), atol=1e-6)
    record = result.to_dict()
    assert len(record["learned_sink_share"]) == 2 and record["learned_sink_queries"] == 8
    # a sink logit of -30 leaves e^-30 ≈ 1e-13; the share is read from float32 probabilities (1 - their sum): < 1e-6
    assert record["learned_sink_share"][0][3] < 1e-6 < record["learned_sink_share"][0][0]
    from posprobe.plotting.attention import learned_sink_chart

    cells = [t.get_text() for t in learned_sink_chart(result).axes[0].texts]  # heads x layers, row by row
    assert cells == [f"{v:.2f}" for v in result.learned_sinks.learned_sink_share.T.ravel()]


def test_content_free_sink_share_is_the_models_own_on_the_constant_sequence(tmp_path):
    """F̂ of layer 0 with the sink logits gives the share the model's own softmax leaves to the sink on the
    constant sequence of the average word (causal, windowed mask)."""
    model = _gpt_oss([2.0, -1.0, 0.5, 3.0])
    model.save_pretrained(tmp_path)
    ctx = _context(tmp_path)
    n = 14
    embeddings = model.get_input_embeddings()
    with torch.no_grad():
        embeddings.weight[0] = embeddings.weight.mean(0)
    probs = _eager_probs(model, [0] * n)[0]
    kind = ctx.layer_kinds(n)[0]
    k = np.arange(n)[None, :] - np.arange(n)[:, None]
    allowed = (k <= 0) & np.vectorize(kind.allows)(k)
    share = content_free_sink_share(content_free_scores(ctx, 0, n), ctx.tensor(ctx.family.sinks, 0), allowed)
    np.testing.assert_allclose(share, 1.0 - probs.sum(-1), atol=1e-9)
    result = posprobe.profiles(str(tmp_path), layers=[0], positions=n)  # the mean over queries, in its JSON
    np.testing.assert_allclose(result.learned_sink_share[0], share.mean(-1), atol=1e-12)
    assert len(json.loads(result.to_json())["content_free_learned_sink_share"][0]) == 4


def _mla_scores(model, path, layer: int = 0) -> np.ndarray:
    model.save_pretrained(path)
    return content_free_scores(_context(path), layer, N)


def test_mla_scores_split_into_a_position_free_constant_and_a_rotary_part(tmp_path):
    import copy

    model = build("deepseek_v3")  # kv_lora_rank 8, 4 rotary dims, 8 position-free dims per head
    attention = model.layers[0].self_attn
    full = _mla_scores(model, tmp_path / "full")
    rank, p = model.config.kv_lora_rank, model.config.qk_nope_head_dim
    no_rotary = copy.deepcopy(model)  # the shared rotary key k_rot = 0: only q_pass . k_pass is left
    with torch.no_grad():
        no_rotary.layers[0].self_attn.kv_a_proj_with_mqa.weight[rank:] = 0
        no_rotary.layers[0].self_attn.kv_a_proj_with_mqa.bias[rank:] = 0
    position_free = _mla_scores(no_rotary, tmp_path / "pass")
    no_pass = copy.deepcopy(model)  # every head's k_pass = 0: only the rotary part is left
    with torch.no_grad():
        rows = no_pass.layers[0].self_attn.kv_b_proj.weight.view(4, p + model.config.v_head_dim, rank)
        rows[:, :p] = 0
    rotary_part = _mla_scores(no_pass, tmp_path / "rot")
    np.testing.assert_allclose(position_free + rotary_part, full, atol=1e-12)
    assert np.ptp(position_free, axis=(1, 2)).max() < 1e-12  # the position-free part: one constant per head
    assert np.ptp(rotary_part[:, -1, :], axis=-1).min() > 1e-5  # the rotary part varies with the key's position
    # the constant is q_pass . k_pass * scaling from the model's own modules on the average word
    x = model.embed_tokens.weight.mean(0)[None]
    with torch.no_grad():
        h = model.layers[0].input_layernorm(x)
        q = attention.q_b_proj(attention.q_a_layernorm(attention.q_a_proj(h))).view(4, -1)[:, :p]
        latent = attention.kv_a_layernorm(attention.kv_a_proj_with_mqa(h)[:, :rank])
        k = attention.kv_b_proj(latent).view(4, -1)[:, :p]
        expected = ((q * k).sum(-1) * attention.scaling).double().numpy()
    np.testing.assert_allclose(position_free[:, 0, 0], expected, rtol=1e-6)
    bands = posprobe.rotary(str(tmp_path / "full"), layers=[0])
    assert (bands.rotated_dims, bands.head_dim) == (4, 12) and "position-free part" in bands.note()


def test_rotary_bands_say_which_layers_are_nope(tmp_path):
    build("smollm3").save_pretrained(tmp_path)
    bands = posprobe.rotary(str(tmp_path))
    assert "NoPE" in bands.layer_kinds[1] and "NoPE layers [1]" in bands.note()
    titles = [ax.get_title() for ax in bands.plot().axes if ax.get_title()]
    assert titles == ["layer 0", "layer 1 (global, NoPE)"]  # each panel says its layer's kind


def test_states_cover_every_layer_of_a_hybrid_and_name_its_layer_kinds():
    """Hidden state l + 1 is layer l's output, the convolution layer's included: its positional vectors are the
    per-position means of the model's own hidden states; the JSON and the figure titles name each layer's kind."""
    model = build("lfm2").float()  # full_attention, conv, full_attention
    ids = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]] * 4
    result = posprobe.states(model, input_ids=ids, max_length=8, min_texts=9)  # positions 0..2: 12 texts each
    assert result.n_states == 4 and np.isfinite(result.massive_max).all() and result.vectors.n_kept == 3
    with torch.no_grad():
        hidden = [model(input_ids=torch.tensor([x]), output_hidden_states=True).hidden_states for x in ids]
    means = torch.stack([torch.stack([h[2][0, i] for h in hidden]).double().mean(0) for i in range(3)])
    np.testing.assert_allclose(result.positional_vectors[2, :3], (means - means.mean(0)).numpy(), atol=1e-5)
    assert result.layer_kinds[0] == result.layer_kinds[2] == "global"
    assert "'conv'" in result.layer_kinds[1] and "no positional score" in result.layer_kinds[1]
    assert json.loads(result.to_json())["layer_kinds"] == result.layer_kinds
    for what in ("summary", "gram"):
        title = result.plot(what)._suptitle.get_text()
        assert "global 0, 2; no softmax attention, gated short-convolution layers 1" in title, what


def test_a_hybrids_other_layers_are_listed_with_their_kind_and_no_positional_score(tmp_path, capsys):
    from posprobe.cli import main

    model = build("lfm2")  # layer types: full_attention, conv, full_attention
    model.save_pretrained(tmp_path / "model")
    result = posprobe.profiles(str(tmp_path / "model"), layers="all", positions=N)
    assert np.isnan(result.profiles[1]).all() and np.isfinite(result.profiles[[0, 2]]).all()
    assert "no positional score" in result.layer_kinds[1] and "'conv'" in result.layer_kinds[1]
    assert "no positional score" not in result.layer_kinds[0] + result.layer_kinds[2]
    code = main(["profiles", str(tmp_path / "model"), "--positions", str(N), "--out", str(tmp_path / "out")])
    text = "".join(capsys.readouterr())  # the table goes to stderr
    assert code in (0, None) and "layer 1: no softmax attention" in text and "layer 0:" not in text
    # a hybrid whose last layer has no attention (and so no query weight) is read, not taken for a truncated file
    ending = build("lfm2")
    ending.config.layer_types = ["full_attention", "conv", "conv"]
    from transformers import AutoModel

    torch.manual_seed(0)
    AutoModel.from_config(ending.config).save_pretrained(tmp_path / "ending")
    kinds = _context(tmp_path / "ending").layer_kinds(N)
    assert [k.attention for k in kinds] == ["full", "none", "none"]
    # on text: the attention layers recorded, the convolution layer listed (no pair, no score)
    on_text = posprobe.attention_profiles(model, input_ids=[[5, 6, 7, 8], [9, 10, 11]], max_length=4)
    assert on_text.attention_layers == [0, 2] and on_text.layer_kinds == result.layer_kinds
    assert np.isnan(on_text.mean_distance[1]).all() and np.isfinite(on_text.mean_distance[[0, 2]]).all()
    # reading every layer's attention (needle's retrieval) still refuses a hybrid, in one line
    from posprobe.capture.model import check_model

    with pytest.raises(PosprobeError, match="is a hybrid") as err:
        check_model(model)
    assert "\n" not in str(err.value)
    assert check_model(model, hybrid=True) == (3, 4)
    from posprobe.capture.model import attention_layers

    model.config.layer_types = None  # which layers attend is then unknown: one line, not a guess
    with pytest.raises(PosprobeError, match="names the kind of 0 of its 3 layers") as err:
        attention_layers(model)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("model_type", ["mamba", "rwkv", "xlstm"])
def test_models_without_softmax_attention_are_refused_in_one_line(model_type, tmp_path):
    from safetensors.numpy import save_file

    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 32}))
    save_file({"embeddings.weight": np.zeros((4, 32), dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(PosprobeError) as err:
        posprobe.profiles(str(tmp_path))
    message = str(err.value)
    assert "no softmax attention" in message and "\n" not in message


def test_attention_on_text_refuses_a_model_without_softmax_attention_before_running_it():
    from transformers import MambaConfig, MambaModel

    model = MambaModel(MambaConfig(vocab_size=99, hidden_size=16, state_size=4, num_hidden_layers=1))
    with pytest.raises(PosprobeError, match="no softmax attention") as err:
        posprobe.attention_profiles(model, input_ids=[[5, 6, 7]], max_length=4)
    assert "\n" not in str(err.value) and "posprobe states" in str(err.value)
