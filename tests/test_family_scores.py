"""SPEC §9 parity: for every analysable family of the family table (and the config switches that change how one
reads), posprobe's content-free scores, read lazily from the saved checkpoint, equal the real attention module's
pre-softmax scores on the constant sequence of the average word embedding, every layer, float64; and the pairs the
model's softmax sees are exactly those posprobe's layer kinds (causality, local windows) say."""

from __future__ import annotations

import numpy as np
import pytest
from family_models import CASES, FLOAT32, case, reference_scores

import posprobe
from posprobe.architectures.table import NOPE, SINUSOIDAL, TABLE_KINDS
from posprobe.checkpoint import WeightReader, resolve_model
from posprobe.families import FAMILIES, family_for_type
from posprobe.families.context import SCORE_MODULES, ModelContext, content_free_scores
from posprobe.families.windows import attention_layers

N = 16
# Kept in the default run: one case of each reading path; the rest run in the slow tier (CI).
QUICK = {"llama", "gemma3_text", "codegen", "falcon-new", "bloom", "opt", "mobilebert", "longformer",
         "deberta-absolute", "marian"}  # fmt: skip
QUICK |= {"ergo", "kolibri1_1"}  # issue 44: new score code (a global logit scale; a weightless indexer, NVFP4 keys)
TESTED_ELSEWHERE = {"t5", "umt5", "longt5", "mpnet", "deberta-v2", "deberta"}  # tests/test_families_bias.py


def test_matrix_covers_every_analysable_family():
    """Adding a family = one table entry + one tiny config here; a family without one fails this test."""
    wanted = {f.name for f in FAMILIES if f.analysable and (f.kind in SCORE_MODULES or f.kind in TABLE_KINDS)}
    tested = {family_for_type(case(name).model_type).name for name in CASES}
    assert wanted - TESTED_ELSEWHERE - {"bert", "roberta", "electra", "albert", "distilbert", "gpt2"} <= tested
    assert QUICK <= set(CASES)


def _params():
    return [pytest.param(name, marks=() if name in QUICK else pytest.mark.slow) for name in sorted(CASES)]


@pytest.mark.parametrize("name", _params())
def test_content_free_scores_equal_the_model(name, tmp_path):
    from family_models import build

    c = case(name)
    model = build(name)
    model.save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format), mode="faithful")
    ctx = ctx.for_stack(c.stack)  # an encoder-decoder's decoder read through fields of its own (BigBird-Pegasus)
    ours = np.stack([content_free_scores(ctx, layer, N) for layer in range(ctx.layers())])
    ref = reference_scores(model, N, c.word_id, c.stack)
    attention = attention_layers(ctx)  # a hybrid's other layers (Mamba, convolutions) have no score: NaN
    assert np.isnan(np.delete(ours, attention, axis=0)).all()
    ours = ours[attention]
    assert ours.shape == ref.scores.shape == (len(attention), ctx.shape.heads, N, N) and len(attention) >= 1
    # the pairs the model's softmax sees are those posprobe's layer kinds and causality say
    k = np.arange(N)[None, :] - np.arange(N)[:, None]
    kinds = [ctx.layer_kinds(N)[layer] for layer in attention]
    for layer, kind in enumerate(kinds):
        expected = np.vectorize(kind.allows)(k) & kind.allowed(N) & ((k <= 0) if ctx.causal() else True)
        expected = np.broadcast_to(expected, ref.allowed[layer].shape)  # a mask per head (a block indexer)
        np.testing.assert_array_equal(ref.allowed[layer], expected, err_msg=f"{name} layer {layer}: {kind}")
    # a layer's heads beyond its own query-head count (Laguna) are NaN in both: no such head
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref.scores))
    ours, ref_scores = np.nan_to_num(ours), np.nan_to_num(ref.scores)
    allowed = ref.allowed if ref.allowed.ndim == 4 else ref.allowed[:, None]
    tolerance = 1e-4 if name in FLOAT32 else 1e-5
    if c.compare == "exact":
        diff = np.where(allowed, ours - ref_scores, 0.0)
        assert np.abs(diff).max() <= tolerance * max(1.0, np.abs(ours).max()), name
    else:  # equal up to a constant per query row on the pairs the model attends
        diff = np.where(allowed, ours - ref_scores, np.nan)
        assert np.nanmax(np.nanmax(diff, -1) - np.nanmin(diff, -1)) < tolerance, name
    if ctx.kind != NOPE:  # positions really matter in the test model (NoPE: only through the causal mask)
        assert np.std(ours[..., N // 2, :]) > 0
    if ctx.kind == SINUSOIDAL:  # a sinusoidal P is exactly Toeplitz (known answer)
        result = posprobe.toeplitz(str(tmp_path))
        assert result.toeplitz_r2 > 1 - 1e-9 and result.n_positions == 64


@pytest.mark.slow
@pytest.mark.parametrize("name", ["big_bird", "bigbird_pegasus"])
def test_bigbird_block_sparse_attends_pairs_with_the_same_scores(name, tmp_path):
    """Beyond (5 + 2 r) blocks BigBird attends block-sparsely (random blocks): every pair it attends has the score
    F̂ gives it (its probabilities are softmax(F̂) over those pairs, up to a constant per row), as the layer kind
    says; shorter sequences get full attention (the parity test above). BigBird-Pegasus: its encoder."""
    import torch
    from family_models import _layers, build

    from posprobe.capture.model import stack_to_run

    model = build(name)
    model.save_pretrained(tmp_path)
    n = 32  # > (5 + 2 * 1) * 4 = 28: block sparse
    source = resolve_model(str(tmp_path))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format), mode="faithful")
    kinds = ctx.layer_kinds(n)
    assert kinds[0].attention == "block-sparse" and "beyond 28 positions" in kinds[0].describe()
    assert ctx.layer_kinds(28)[0].attention == "full"
    ours = np.stack([content_free_scores(ctx, layer, n) for layer in range(ctx.layers())])
    embeddings = model.get_input_embeddings()
    with torch.no_grad():
        embeddings.weight[0] = embeddings.weight.mean(0)
        first = {}
        net = stack_to_run(model)

        def keep_first(module, args):  # returns None: the layer's own arguments go on unchanged
            first.setdefault("x", args[0].clone())

        hook = _layers(net)[0].register_forward_pre_hook(keep_first)
        net(input_ids=torch.zeros(1, n, dtype=torch.long))  # the first layer's input
        hook.remove()
        for layer in _layers(net):  # every layer fed the embedding-level input, as F̂ assumes
            layer.register_forward_pre_hook(lambda m, a: (first["x"], *a[1:]))
        probs = net(input_ids=torch.zeros(1, n, dtype=torch.long), output_attentions=True).attentions
    for layer, p in enumerate(probs):
        attended = p[0].double().numpy() > 0
        assert 0 < attended.mean() < 1  # sparse: some pairs are not attended
        with np.errstate(divide="ignore"):
            diff = np.where(attended, ours[layer] - np.log(p[0].double().numpy()), np.nan)
        assert np.nanmax(np.nanmax(diff, -1) - np.nanmin(diff, -1)) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("name", ["jetmoe", "doge", "dory", "granite_swa"])
def test_per_position_inputs_equal_the_model(name):
    """Issue 34's attention variants with a different input at every position (SPEC §13): JetMoE routes each
    position's query to its own experts, Doge gives each key its own value bias, Dory rescales each unit-norm
    query, Granite SWA rotates each layer at its own base: F̂ of those inputs equals the module's scores on them."""
    import torch
    from family_models import _CALLERS, _RECORDED, RECORD, _layers, _record, build
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    from posprobe.checkpoint.in_memory import StateDictReader, source_from_model

    model = build(name)
    ctx = ModelContext(source_from_model(model), StateDictReader(model), mode="faithful")
    rows = np.random.default_rng(0).normal(size=(N, model.config.hidden_size))
    AttentionInterface.register(RECORD, _record)
    ALL_MASK_ATTENTION_FUNCTIONS.register(RECORD, eager_mask)
    for layer in attention_layers(ctx):
        handle = _layers(model)[layer].register_forward_pre_hook(
            lambda m, args, kwargs: ((torch.from_numpy(rows)[None], *args[1:]), kwargs), with_kwargs=True
        )
        try:
            _RECORDED.clear()
            _CALLERS.clear()
            model.set_attn_implementation(RECORD)
            with torch.no_grad():
                model(input_ids=torch.zeros(1, N, dtype=torch.long), use_cache=False)
        finally:
            handle.remove()
            model.set_attn_implementation("eager")
        theirs, mask = _RECORDED[layer]
        ours = content_free_scores(ctx, layer, N, inputs=ctx.layer_inputs({layer: rows}))
        allowed = np.broadcast_to(mask > -1e30, ours.shape)
        np.testing.assert_allclose(ours[allowed], theirs[allowed], rtol=1e-5, atol=1e-5 * np.abs(theirs).max())
    if name == "jetmoe":  # the positions really took different experts
        from posprobe.families.routed import routed_experts

        x = ctx.layer_input(rows, 0)
        router = ctx.tensor(ctx.family.tensors["router"] + ".weight", 0)
        assert len({tuple(e) for e in routed_experts(x @ router.T, 2)}) > 1


@pytest.mark.slow
def test_neomme_reads_the_sign_of_each_layers_input_mix(tmp_path):
    """NeoMME's layer l reads RMSNorm(lambda_0 h + lambda_1 x_0): on the embedding-level input (h = x_0) the norm
    keeps only the sign of lambda_0 + lambda_1, which flips q and k and so the bias terms' share of the scores."""
    import torch
    from family_models import build

    model = build("neomme")
    with torch.no_grad():
        model.layers[1].lambdas.copy_(torch.tensor([-0.9, 0.3]))
    model.save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format), mode="faithful")
    ours = np.stack([content_free_scores(ctx, layer, N) for layer in range(ctx.layers())])
    ref = reference_scores(model, N)
    diff = np.where(ref.allowed[:, None], ours - ref.scores, 0.0)
    assert np.abs(diff).max() < 1e-5 * max(1.0, np.abs(ours).max())
    flipped = np.where(ref.allowed[1], ours[1] - reference_scores(build("neomme"), N).scores[1], 0.0)
    assert np.abs(flipped).max() > 1e-3  # the sign mattered


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) for n in ("longcat_flash", "neomme", "zaya", "hrm_text")]
)
def test_layers_whose_inputs_hidden_states_do_not_hold_refuse_text_in_one_line(name):
    """LongCat-Flash's second attention sublayers, NeoMME's mixed layer inputs and ZAYA's convolutional q/k: a
    mean hidden state from text is not what these layers read, so text-conditioned scores (SPEC §13) are refused."""
    from family_models import build

    from posprobe.errors import PosprobeError

    with pytest.raises(PosprobeError) as err:
        posprobe.fhat(build(name), layer=-1, positions=6, texts=["a b c d e f g", "b c d e f g h"])
    assert "cannot read inputs from text" in str(err.value) or "does not give them" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "name, change, words",
    [
        ("xlnet", {"attn_type": "uni"}, "attn_type 'uni'"),
        ("xlnet", {"bi_data": True}, "bi_data"),
        ("funnel", {"block_repeats": [2, 1]}, "block_repeats"),
    ],
)
def test_settings_of_the_odd_designs_posprobe_does_not_read_are_refused_in_one_line(name, change, words, tmp_path):
    """XLNet's pretraining settings (causal 'uni' attention, bi_data) and Funnel's repeated layers are named and
    refused, not read as the released settings."""
    import json

    from family_models import build

    from posprobe.errors import PosprobeError

    build(name).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(PosprobeError) as err:
        posprobe.fhat(str(tmp_path), layer=0, positions=8)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("n", [23, 30])
def test_block_indexer_selection_per_group_at_other_lengths(n, tmp_path, monkeypatch):
    """MiniMax M3's block indexer (families.block_indexed): each key-head group's selection equals the module's own
    block mask at lengths that leave a short last block, with indexer heads smaller than the rotary part (the module
    cuts its angles to the indexer's head size, pairing dims of different frequencies)."""
    from family_models import build

    model_type, config = CASES["minimax_m3_vl_text"]
    cut = {**config, "index_head_dim": 2, "rope_parameters": dict(rope_type="default", rope_theta=100.0)}
    monkeypatch.setitem(CASES, "minimax_m3_vl_text-cut", (model_type, cut))
    model = build("minimax_m3_vl_text-cut")
    model.save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format), mode="faithful")
    ref = reference_scores(model, n)
    k = np.arange(n)[None, :] - np.arange(n)[:, None]
    kinds = ctx.layer_kinds(n)
    for layer in (1, 2):
        ours = kinds[layer].allowed(n) & (k <= 0)
        assert ours.shape == (4, n, n) and not (ours[0] == ours[2]).all()  # the two groups pick differently
        np.testing.assert_array_equal(ref.allowed[layer], ours)
        assert ours.sum() < 4 * n * (n + 1) // 2  # sparse: some causal pairs dropped


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reformer", "reformer-masked"])
@pytest.mark.parametrize("n", [10, 13, 24])
def test_reformer_local_chunks_at_padded_lengths(name, n, tmp_path):
    """Reformer pads a sequence longer than its shortest chunk to a multiple of its chunk lengths (8 here) and its
    local layers see their chunk and its neighbours, wrapping around: at lengths the padding changes (10 -> 16: four
    chunks of 4, not three), the pairs its softmax sees and their scores are those of posprobe's layer kinds; its
    LSH layers have no positional score (NaN)."""
    from family_models import build

    model = build(name)
    model.save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format), mode="faithful")
    ref = reference_scores(model, n)
    attention = attention_layers(ctx)
    ours = np.stack([content_free_scores(ctx, layer, n) for layer in range(ctx.layers())])
    assert np.isnan(np.delete(ours, attention, axis=0)).all() and len(attention) == len(ref.scores)
    k = np.arange(n)[None, :] - np.arange(n)[:, None]
    for index, layer in enumerate(attention):
        expected = ctx.layer_kinds(n)[layer].allowed(n) & ((k <= 0) if ctx.causal() else True)
        np.testing.assert_array_equal(ref.allowed[index], expected)
        assert not expected.all()  # chunks: some pairs unseen
        diff = np.where(ref.allowed[index], ours[layer] - ref.scores[index], 0.0)
        assert np.abs(diff).max() <= 1e-5 * max(1.0, np.abs(ours[layer]).max())
    if name == "reformer-masked" and n == 10:  # chunk 0 wraps to the last (padding) chunk, not to keys 8 and 9
        assert not ref.allowed[0][:4, 8:].any()


@pytest.mark.slow
def test_reformer_refuses_lengths_whose_chunks_see_a_neighbour_twice(tmp_path):
    """Chunks of 4 seeing one chunk before and one after: a sequence padded to 8 has two chunks, so the chunk before
    is the chunk after and the model counts its keys twice in the softmax: no set of pairs says that, refused."""
    from family_models import build

    from posprobe.errors import PosprobeError

    build("reformer-masked").save_pretrained(tmp_path)
    with pytest.raises(PosprobeError) as err:
        posprobe.fhat(str(tmp_path), layer=1, positions=6)
    assert "twice" in str(err.value) and "\n" not in str(err.value)
    assert posprobe.fhat(str(tmp_path), layer=1, positions=4).matrices.shape[-1] == 4  # unchunked: all pairs


def test_axial_position_rows_concatenate_each_axis_row():
    """Axial tables (Reformer): position p = p_0 s_1 + p_1 reads [F_0[p_0] | F_1[p_1]], the last axis fastest."""
    from posprobe.families.axial import axial_rows

    rng = np.random.default_rng(0)
    first, second = rng.normal(size=(3, 1, 2)), rng.normal(size=(1, 4, 5))
    rows = axial_rows([first, second])
    assert rows.shape == (12, 7)
    for p in range(12):
        np.testing.assert_array_equal(rows[p], np.concatenate([first[p // 4, 0], second[0, p % 4]]))
    with pytest.raises(ValueError):
        axial_rows([rng.normal(size=(3, 2, 2)), second])


@pytest.mark.parametrize("name", ["reformer", "reformer-masked"])
def test_reformer_position_table_and_its_parameter_count_are_the_models(name, tmp_path):
    """E_P read from the checkpoint equals the model's own position embeddings of positions 0..n-1 (axial: factor
    rows concatenated per position; plain: its table), and `params` counts the parameters that table really has."""
    import torch
    from family_models import build

    from posprobe.analysis.params import positional_parameter_counts

    model = build(name)
    model.save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format), mode="faithful")
    table = ctx.position_table.table
    assert table.shape == (32, 32)
    with torch.no_grad():
        theirs = model.embeddings.position_embeddings(torch.arange(32)[None])[0].double().numpy()
    np.testing.assert_array_equal(table, theirs)
    held = sum(p.numel() for p in model.embeddings.position_embeddings.parameters())
    assert positional_parameter_counts(source.config).absolute == held == (208 if name == "reformer" else 1024)


@pytest.mark.slow
def test_reformer_per_position_inputs_equal_the_model():
    """Reformer's reversible layers: the hidden state entering layer l (what transformers returns as hidden_states[l])
    is the input its attention normalises and projects, so F̂ of per-position inputs (SPEC §13) equals its local
    layer's scores on them."""
    import torch
    from family_models import _layers, _SoftmaxInputs, build

    from posprobe.checkpoint.in_memory import StateDictReader, source_from_model

    model = build("reformer")
    ctx = ModelContext(source_from_model(model), StateDictReader(model), mode="faithful")
    rows = np.random.default_rng(0).normal(size=(N, model.config.hidden_size))
    layer = 2  # the second local layer
    handle = _layers(model)[layer].register_forward_pre_hook(
        lambda m, args, kwargs: (args, {**kwargs, "hidden_states": torch.from_numpy(rows)[None]}), with_kwargs=True
    )
    try:
        with torch.no_grad(), _SoftmaxInputs(N) as seen:
            model(input_ids=torch.zeros(1, N, dtype=torch.long))
    finally:
        handle.remove()
    assert len(seen.inputs) == 2  # the two local layers' (the LSH layer's softmax is not recorded)
    theirs = seen.inputs[-1]
    ours = content_free_scores(ctx, layer, N, inputs=ctx.layer_inputs({layer: rows}))
    allowed = np.isfinite(theirs)
    assert 0 < allowed.mean() < 1
    np.testing.assert_allclose(ours[allowed], theirs[allowed], rtol=1e-9, atol=1e-9 * np.abs(theirs[allowed]).max())


def test_reformer_is_causal_where_it_is_a_decoder():
    """Reformer's LM head needs is_decoder (causal); its masked LM (the config's default) attends both ways, so the
    commands that need next-token predictions refuse it in one line."""
    from posprobe.architectures.table import is_causal
    from posprobe.errors import PosprobeError
    from posprobe.pipelines.needle import _check_causal

    family = family_for_type("reformer")
    assert is_causal(family, {"model_type": "reformer", "is_decoder": True})
    assert not is_causal(family, {"model_type": "reformer"})
    with pytest.raises(PosprobeError) as err:
        _check_causal({"model_type": "reformer", "is_decoder": False}, "masked")
    assert "not a causal language model" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_funnel_decoder_scores_equal_its_upsampling_layers(tmp_path):
    """FunnelModel's upsampling decoder (`--stack decoder`, issue 34 stacks) attends at full length with the first
    block's relative positions, <cls> apart, one segment, both ways: F̂ of each of its layers equals the layer's
    softmax input on the embedding output of the average word (SPEC §9: every layer reads the embedding level)."""
    import torch
    from family_models import build

    model = build("funnel")
    model.save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format), mode="faithful").for_stack("decoder")
    assert ctx.layers() == model.config.num_decoder_layers and not ctx.causal()
    ours = np.stack([content_free_scores(ctx, layer, N) for layer in range(ctx.layers())])
    inputs, softmax = [], torch.softmax

    def record(x, *args, **kwargs):
        inputs.append(x[0].detach().double().numpy())
        return softmax(x, *args, **kwargs)

    ids = torch.zeros(1, N, dtype=torch.long)
    with torch.no_grad():
        model.get_input_embeddings().weight[0] = model.get_input_embeddings().weight.mean(0)
        x = model.embeddings(ids)
        structure = model.decoder.attention_structure  # the decoder's own inputs: positions 0..N-1, token type 0
        attention_inputs = structure.init_attention_inputs(x, token_type_ids=torch.zeros_like(ids))
        torch.softmax = record
        try:
            for layer in model.decoder.layers:
                layer(x, x, x, attention_inputs)
        finally:
            torch.softmax = softmax
    ref = np.stack(inputs)
    assert ref.shape == ours.shape == (ctx.layers(), 4, N, N)
    # its softmax input is cast to float32 (transformers' Funnel), as the parity test above allows
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5 * max(1.0, np.abs(ref).max()))
    assert np.std(ours[..., N // 2, 1:]) > 0  # positions matter (column 0: <cls>, kept apart)
    assert posprobe.fhat(str(tmp_path), layer=0, stack="decoder", positions=N).to_dict()["stack"] == "decoder"


@pytest.mark.slow
def test_a_funnel_without_its_decoder_refuses_the_decoder_stack_in_one_line(tmp_path):
    """FunnelBaseModel has no upsampling decoder: `--stack decoder` names the missing weights, in one line."""
    import transformers as tf
    from family_models import case

    from posprobe.errors import PosprobeError

    tf.FunnelBaseModel(tf.FunnelConfig(**case("funnel").config)).save_pretrained(tmp_path)
    with pytest.raises(PosprobeError, match="holds no decoder weights") as err:
        posprobe.fhat(str(tmp_path), layer=0, stack="decoder", positions=8)
    assert "\n" not in str(err.value)
    assert posprobe.fhat(str(tmp_path), layer=0, positions=8).to_dict()["stack"] == "encoder"  # its encoder: read
