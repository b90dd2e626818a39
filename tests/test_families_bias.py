"""Bucketed relative bias (T5 / UMT5 encoder and decoder, MPNet) and disentangled (DeBERTa-v2/v3) content-free scores.

Each family: posprobe's content-free scores, read through the family table from a tiny random model, equal the
pre-softmax scores the real attention modules compute (captured at `softmax`) when every layer's input is the
embedding-level sequence of the average word (SPEC §9), all layers, float64. Bucket functions: parity with
transformers' own over wide ranges.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as tf

import posprobe
from posprobe.checkpoint import WeightReader, resolve_model
from posprobe.checkpoint.in_memory import StateDictReader, source_from_model
from posprobe.cli import main
from posprobe.errors import ArgumentValueError, PosprobeError
from posprobe.families import disentangled as dis
from posprobe.families import relative_bias as rb
from posprobe.families.context import HeadWeights, ModelContext, content_free_scores, reserved_rows

N = 40  # positions analysed: beyond the tiny configs' exact buckets and max distances


def _randomise(model, scale=0.3):
    """Every parameter random (norm weights around 1), so biases and norms are really exercised."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))
    return model.double().eval()


def _context(model) -> ModelContext:
    """The family-table view of an in-memory model (the same code as for a folder)."""
    return ModelContext(source_from_model(model), StateDictReader(model))


class _Capture:
    """Records softmax inputs (the pre-softmax scores) and feeds every layer a fixed input sequence."""

    def __init__(self, monkeypatch):
        self.scores: list[torch.Tensor] = []
        original = torch.nn.functional.softmax

        def recording(inp, *args, **kwargs):
            self.scores.append(inp.detach().clone())
            return original(inp, *args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "softmax", recording)
        self.layer_input = None

    def feed(self, layers):
        """Replace the hidden states entering each of `layers` by `self.layer_input` (set before or during the run)."""

        def hook(module, args, kwargs):
            if args:
                return (self.layer_input, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": self.layer_input}

        for layer in layers:
            layer.register_forward_pre_hook(hook, with_kwargs=True)


# ---------------------------------------------------------------- bucket functions


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("buckets", "max_distance"), [(32, 128), (8, 20), (10, 24), (64, 256), (6, 7)])
def test_t5_bucket_equals_transformers(bidirectional, buckets, max_distance):
    offsets = torch.arange(-1000, 1001)
    ours = rb.t5_bucket(offsets, bidirectional, buckets, max_distance)
    theirs = tf.models.t5.modeling_t5.T5Attention._relative_position_bucket(
        offsets, bidirectional=bidirectional, num_buckets=buckets, max_distance=max_distance
    )
    assert torch.equal(ours, theirs)
    fake = types.SimpleNamespace(  # UMT5's bucket method reads its settings from the module
        relative_attention_num_buckets=buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=not bidirectional,
    )
    umt5 = tf.models.umt5.modeling_umt5.UMT5Attention._relative_position_bucket(fake, offsets)
    assert torch.equal(ours, umt5)
    if not bidirectional:
        assert (ours[offsets > 0] == 0).all()  # causal: every look-ahead shares bucket 0


def test_t5_bucket_known_values():
    """T5 defaults (32 buckets, max distance 128): k = j - i <= 0 in 0..15, k > 0 in 16..31."""
    k = torch.tensor([0, -1, -7, -8, -127, -128, -5000, 1, 7, 8, 5000])
    assert rb.t5_bucket(k, True, 32, 128).tolist() == [0, 1, 7, 8, 15, 15, 15, 17, 23, 24, 31]


def test_mpnet_bucket_equals_transformers():
    offsets = torch.arange(-600, 601)
    theirs = tf.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket(offsets)
    assert torch.equal(rb.t5_bucket(offsets, True, rb.MPNET_BUCKETS, rb.MPNET_MAX_DISTANCE), theirs)


@pytest.mark.parametrize(("bucket_size", "max_position"), [(256, 512), (8, 64), (16, 40), (4, 9)])
def test_deberta_log_bucket_equals_transformers(bucket_size, max_position):
    rel = torch.arange(-2000, 2001)
    theirs = tf.models.deberta_v2.modeling_deberta_v2.make_log_bucket_position(rel, bucket_size, max_position)
    ours = dis.log_bucket(rel, bucket_size, max_position)
    assert torch.equal(ours, theirs.to(torch.long))
    assert torch.equal(dis.log_bucket(-rel, bucket_size, max_position), -ours)  # odd: p2c may use either sign


# ---------------------------------------------------------------- T5 / UMT5

T5_TINY = dict(
    vocab_size=99,
    d_model=32,
    d_kv=8,
    num_heads=4,
    d_ff=37,
    num_layers=3,
    num_decoder_layers=3,
    relative_attention_num_buckets=10,
    relative_attention_max_distance=24,
    dropout_rate=0.0,
    attn_implementation="eager",
)


def _t5_stack(family, stack):
    torch.manual_seed(0)
    if family == "t5":
        model = tf.T5ForConditionalGeneration(tf.T5Config(**T5_TINY))
    else:
        model = tf.UMT5ForConditionalGeneration(tf.UMT5Config(**T5_TINY))
    return _randomise(model), getattr(model, stack)


@pytest.mark.parametrize("family", ["t5", "umt5"])
@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_t5_scores_equal_module(monkeypatch, family, stack):
    model, module = _t5_stack(family, stack)
    ctx = _context(model)
    assert ctx.family.name == family and ctx.layers(stack) == len(module.block)
    cap = _Capture(monkeypatch)
    cap.layer_input = torch.from_numpy(ctx.word_mean).expand(1, N, -1).clone()
    cap.feed(module.block)
    with torch.no_grad():
        module(inputs_embeds=cap.layer_input, use_cache=False)
    assert len(cap.scores) == len(module.block)  # self-attention only (no encoder states: no cross-attention)
    causal = stack == "decoder"
    assert ctx.causal(stack) == causal
    keep = rb.relative_offsets(N) <= 0 if causal else torch.ones(N, N, dtype=torch.bool)
    for layer, real in enumerate(cap.scores):
        ours = torch.from_numpy(content_free_scores(ctx, layer, N, stack))
        # rtol: transformers computes the RMS variance in float32 even in a float64 model
        torch.testing.assert_close(ours[:, keep], real[0][:, keep], rtol=1e-6, atol=1e-6)
        if causal:
            assert (real[0][:, ~keep] < -1e300).all()  # the model masks every k > 0


def test_t5_reads_layer_0_bias_umt5_its_own():
    """T5 stores the table in layer 0 only and reuses it; UMT5 has one per layer (the entries say which)."""
    for family in ("t5", "umt5"):
        model, module = _t5_stack(family, "encoder")
        ctx = _context(model)
        tables = [b.layer[0].SelfAttention.relative_attention_bias.weight for b in module.block if
                  b.layer[0].SelfAttention.has_relative_attention_bias]  # fmt: skip
        assert len(tables) == (1 if family == "t5" else len(module.block))
        f1 = content_free_scores(ctx, 1, N)
        with torch.no_grad():
            tables[min(1, len(tables) - 1)].add_(1.0)  # the table layer 1 reads: layer 0's (T5) or its own (UMT5)
        torch.testing.assert_close(content_free_scores(_context(model), 1, N), f1 + 1.0)


def test_t5_scores_are_exactly_toeplitz_and_change_with_the_bias():
    """Known answer: a constant content term plus bias[bucket(j - i)]; each diagonal is constant."""
    torch.manual_seed(0)
    heads, buckets = 2, 8
    table = torch.randn(buckets, heads, dtype=torch.float64)
    content = torch.randn(heads, dtype=torch.float64)
    f = rb.t5_scores(content, table, 30, causal=False, num_buckets=buckets, max_distance=20)
    k = rb.relative_offsets(30)
    for off in range(-29, 30):
        diag = f[:, k == off]
        assert torch.equal(diag, diag[:, :1].expand_as(diag))
    bumped = table.clone()
    bumped[rb.t5_bucket(torch.tensor(-3), True, buckets, 20), 1] += 1.0
    g = rb.t5_scores(content, bumped, 30, causal=False, num_buckets=buckets, max_distance=20)
    delta = g - f
    assert torch.allclose(delta[0], torch.zeros_like(delta[0]))
    hit = rb.t5_bucket(k, True, buckets, 20) == rb.t5_bucket(torch.tensor(-3), True, buckets, 20)  # shared log bucket
    assert hit[k == -3].all() and not hit[k == 0].any()
    torch.testing.assert_close(delta[1][hit], torch.ones(int(hit.sum()), dtype=torch.float64))
    torch.testing.assert_close(delta[1][~hit], torch.zeros(int((~hit).sum()), dtype=torch.float64))


# ---------------------------------------------------------------- LongT5


def _from_blocks(scores: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """LongT5's local scores (1, blocks, H, b, 3b [+ side keys]) as (H, n, n) and the pairs it attends: query
    i = block * b + qi sees key j = (block - 1) * b + kj (the side keys of transient-global are left out)."""
    _, blocks, heads, b, _ = scores.shape
    full = torch.full((heads, n, n), -1e30, dtype=torch.float64)
    for block in range(blocks):
        for qi in range(b):
            for kj in range(3 * b):
                i, j = block * b + qi, (block - 1) * b + kj
                if i < n and 0 <= j < n:
                    full[:, i, j] = scores[0, block, :, qi, kj]
    return full, full[0] > -1e9  # the model masks with -1e10


@pytest.mark.parametrize("attention", ["local", pytest.param("transient-global", marks=pytest.mark.slow)])
def test_longt5_encoder_scores_equal_module(monkeypatch, attention):
    """LongT5's encoder attends |j - i| <= local_radius: there its scores are T5's (q . k plus the bucketed bias of
    layer 0's table); the layer kinds say the window (and that transient-global adds side keys outside F̂)."""
    torch.manual_seed(0)
    cfg = tf.LongT5Config(**{**T5_TINY, "local_radius": 5, "global_block_size": 4,
                             "encoder_attention_type": attention})  # fmt: skip
    model = _randomise(tf.LongT5Model(cfg))
    ctx = _context(model)
    kinds = ctx.layer_kinds(N)
    assert [k.window for k in kinds] == [5, 5, 5] and ("side keys" in kinds[0].describe()) == (attention != "local")
    cap = _Capture(monkeypatch)
    cap.layer_input = torch.from_numpy(ctx.word_mean).expand(1, N, -1).clone()
    cap.feed(model.encoder.block)
    with torch.no_grad():
        model.encoder(inputs_embeds=cap.layer_input)
    assert len(cap.scores) == cfg.num_layers
    offsets = rb.relative_offsets(N)
    for layer, real in enumerate(cap.scores):
        theirs, allowed = _from_blocks(real, N)
        assert torch.equal(allowed, offsets.abs() <= 5)
        ours = torch.from_numpy(content_free_scores(ctx, layer, N))
        torch.testing.assert_close(ours[:, allowed], theirs[:, allowed], rtol=1e-5, atol=1e-6)  # softmax in float32


@pytest.mark.slow
def test_longt5_decoder_scores_equal_module(monkeypatch):
    torch.manual_seed(0)
    model = _randomise(tf.LongT5Model(tf.LongT5Config(**T5_TINY, local_radius=5)))
    ctx = _context(model)
    assert ctx.causal("decoder") and all(k.window is None for k in ctx.layer_kinds(N, "decoder"))
    cap = _Capture(monkeypatch)
    cap.layer_input = torch.from_numpy(ctx.word_mean).expand(1, N, -1).clone()
    cap.feed(model.decoder.block)
    with torch.no_grad():
        model.decoder(inputs_embeds=cap.layer_input, use_cache=False)
    keep = rb.relative_offsets(N) <= 0
    for layer, real in enumerate(cap.scores):
        ours = torch.from_numpy(content_free_scores(ctx, layer, N, "decoder"))
        torch.testing.assert_close(ours[:, keep], real[0][:, keep], rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- MPNet


def test_mpnet_scores_equal_module(monkeypatch, tmp_path):
    torch.manual_seed(0)
    cfg = tf.MPNetConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=N + 2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = _randomise(tf.MPNetForMaskedLM(cfg))
    model.save_pretrained(tmp_path / "mpnet")
    source = resolve_model(str(tmp_path / "mpnet"))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format))
    cap = _Capture(monkeypatch)
    model.mpnet.embeddings.register_forward_hook(lambda m, a, out: setattr(cap, "layer_input", out))
    cap.feed(model.mpnet.encoder.layer)
    ids = torch.full((1, N), 5)  # any non-padding id: positions 2 .. N+1, as for real text
    with torch.no_grad():
        model(inputs_embeds=torch.from_numpy(ctx.word_mean).expand(1, N, -1).clone(), attention_mask=ids * 0 + 1)
    assert len(cap.scores) == cfg.num_hidden_layers
    for layer, real in enumerate(cap.scores):
        ours = torch.from_numpy(content_free_scores(ctx, layer, N))
        torch.testing.assert_close(ours, real[0], rtol=1e-10, atol=1e-10)
    assert model.mpnet.embeddings.padding_idx + 1 == 2 == reserved_rows(source.config, "m")
    assert reserved_rows({**source.config, "pad_token_id": 0}, "m") == 2  # fixed in MPNet, whatever the config says


# ---------------------------------------------------------------- DeBERTa-v2/v3

DEBERTA_V3 = dict(  # v3-style: shared keys, log buckets, relative-embedding LayerNorm, no absolute input
    relative_attention=True,
    pos_att_type="p2c|c2p",
    share_att_key=True,
    position_buckets=8,
    max_relative_positions=32,
    norm_rel_ebd="layer_norm",
    position_biased_input=False,
    type_vocab_size=0,
)
DEBERTA_V2_OLD = dict(  # separate position projections, no buckets (clamped at the span), absolute input, c2p only
    relative_attention=True,
    pos_att_type=["c2p"],
    share_att_key=False,
    max_relative_positions=12,
    position_biased_input=True,
    type_vocab_size=2,
    embedding_size=24,
)
DEBERTA_P2C_UNSHARED = dict(
    relative_attention=True,
    pos_att_type="c2p|p2c",
    share_att_key=False,
    position_buckets=16,
    max_relative_positions=-1,  # defaults to max_position_embeddings
    norm_rel_ebd="layer_norm",
    position_biased_input=False,
    type_vocab_size=0,
    conv_kernel_size=3,  # the conv after layer 0 changes deeper inputs, not the embedding-level picture
)


@pytest.mark.parametrize("variant", [DEBERTA_V3, DEBERTA_V2_OLD, DEBERTA_P2C_UNSHARED], ids=["v3", "v2-c2p", "p2c"])
def test_deberta_scores_equal_module(monkeypatch, variant):
    torch.manual_seed(0)
    cfg = tf.DebertaV2Config(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=N + 8,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **variant,
    )
    model = _randomise(tf.DebertaV2Model(cfg))
    ctx = _context(model)
    cap = _Capture(monkeypatch)
    model.embeddings.register_forward_hook(lambda m, a, out: setattr(cap, "layer_input", out))
    cap.feed(model.encoder.layer)
    with torch.no_grad():
        model(inputs_embeds=torch.from_numpy(ctx.word_mean).expand(1, N, -1).clone())
    assert len(cap.scores) == cfg.num_hidden_layers
    for layer, real in enumerate(cap.scores):
        ours = torch.from_numpy(content_free_scores(ctx, layer, N))
        torch.testing.assert_close(ours, real[0], rtol=1e-10, atol=1e-10)


DEBERTA_V1 = dict(relative_attention=True, pos_att_type=["c2p", "p2c"], max_relative_positions=12, type_vocab_size=2,
                  position_biased_input=True)  # fmt: skip
DEBERTA_V1_TALKING = dict(relative_attention=True, pos_att_type="p2c|c2p|p2p", max_relative_positions=-1,
                          type_vocab_size=0, position_biased_input=False, talking_head=True,
                          embedding_size=24)  # fmt: skip


@pytest.mark.parametrize(
    "variant", [DEBERTA_V1, pytest.param(DEBERTA_V1_TALKING, marks=pytest.mark.slow)], ids=["v1", "v1-talking-heads"]
)
def test_deberta_v1_scores_equal_module(monkeypatch, variant):
    """DeBERTa v1: fused per-head in_proj with a separate q_bias, pos_proj / pos_q_proj, a span of
    min(n, max_relative_positions) rows, the scale counting every listed term (p2p too), talking heads."""
    torch.manual_seed(0)
    cfg = tf.DebertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                           intermediate_size=37, max_position_embeddings=N + 8, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, **variant)  # fmt: skip
    model = _randomise(tf.DebertaModel(cfg))
    ctx = _context(model)
    assert ctx.kind == "disentangled" and ctx.qkv == "per-head"
    cap = _Capture(monkeypatch)
    model.embeddings.register_forward_hook(lambda m, a, out: setattr(cap, "layer_input", out))
    cap.feed(model.encoder.layer)
    with torch.no_grad():
        model(inputs_embeds=torch.from_numpy(ctx.word_mean).expand(1, N, -1).clone())
    assert len(cap.scores) == cfg.num_hidden_layers
    for layer, real in enumerate(cap.scores):
        ours = torch.from_numpy(content_free_scores(ctx, layer, N))
        # DeBERTa v1's LayerNorm computes in float32 even in a float64 model
        torch.testing.assert_close(ours, real[0], rtol=1e-5, atol=1e-6)


def test_deberta_scores_depend_on_offset_only_for_a_constant_input():
    """Known answer: without an absolute input the content-free matrix is Toeplitz (c2p and p2c use r = i - j)."""
    torch.manual_seed(0)
    d, heads = 16, 2
    dc = dis.DisentangledConfig(heads, d // heads, ("c2p", "p2c"), 8, 32, True)
    x = np.broadcast_to(np.random.default_rng(0).normal(size=d), (20, d))
    qk = [torch.randn(heads, d, d // heads, dtype=torch.float64).numpy() for _ in range(2)]
    weights = HeadWeights(qk[0], np.ones((heads, d // heads)), qk[1], np.zeros((heads, d // heads)), 0)
    f = torch.from_numpy(dis.disentangled_scores(x, weights, torch.randn(16, d, dtype=torch.float64).numpy(), dc))
    k = rb.relative_offsets(20)
    for off in range(-19, 20):
        diag = f[:, k == off]
        torch.testing.assert_close(diag, diag[:, :1].expand_as(diag), rtol=1e-12, atol=1e-12)
    assert dc.scale == pytest.approx(math.sqrt(8 * 3), rel=1e-7)


def test_every_bias_and_disentangled_family_is_tested_here():
    """Adding a bucket-bias or disentangled family = one table entry + one tiny model in this file (or a parity
    case in tests/family_models.py: CPM-Ant, whose bias is read as T5's within its text's segment)."""
    from posprobe.architectures.table import BUCKET_BIAS, DISENTANGLED
    from posprobe.families import FAMILIES

    analysable = {f.name for f in FAMILIES if f.analysable and f.kind in (BUCKET_BIAS, DISENTANGLED)}
    assert analysable - {"cpmant"} == {"t5", "umt5", "longt5", "mpnet", "deberta-v2", "deberta"}


# ---------------------------------------------------------------- commands (library and CLI) on saved checkpoints


@pytest.fixture(scope="module")
def bias_checkpoints(tmp_path_factory):
    """Saved tiny T5 (encoder-decoder), MPNet (masked LM: 'mpnet.' prefix) and DeBERTa-v3-style checkpoints."""
    root = tmp_path_factory.mktemp("bias")
    folders = {"t5": root / "t5", "mpnet": root / "mpnet", "deberta": root / "deberta"}
    _t5_stack("t5", "encoder")[0].float().save_pretrained(folders["t5"])
    torch.manual_seed(0)
    mpnet = tf.MPNetForMaskedLM(tf.MPNetConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=37,
                                               max_position_embeddings=N + 2))  # fmt: skip
    _randomise(mpnet).float().save_pretrained(folders["mpnet"])
    deberta = tf.DebertaV2Model(tf.DebertaV2Config(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                                   num_attention_heads=4, intermediate_size=37,
                                                   max_position_embeddings=N, **DEBERTA_V3))  # fmt: skip
    _randomise(deberta).float().save_pretrained(folders["deberta"])
    return folders


def _json(args):
    from typer.testing import CliRunner

    from posprobe.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_t5_decoder_profiles_known_answer(bias_checkpoints, tmp_path):
    """T5's content-free profile is exact: the constant q . k plus bias[bucket(k), h] of layer 0's table."""
    folder = bias_checkpoints["t5"]
    record = _json(["profiles", str(folder), "--stack", "decoder", "--layers", "all", "--positions", "30",
                    "--window", "5", "--out", str(tmp_path), "--json"])  # fmt: skip
    assert record["causal"] is True and record["stack"] == "decoder" and "only k <= 0" in record["convention"]
    with np.load(record["npz"]) as npz:
        profiles, offsets = npz["profiles"], npz["offsets"]
    assert profiles.shape == (3, 4, 59) and list(offsets) == list(range(-29, 30))
    model = tf.T5ForConditionalGeneration.from_pretrained(folder).double()
    table = model.decoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.detach()
    bias = table[rb.t5_bucket(torch.from_numpy(offsets), False, 10, 24)].T.numpy()  # (H, 2n - 1)
    for layer in range(3):
        content = profiles[layer] - bias  # the same constant at every offset: Toeplitz and exact
        np.testing.assert_allclose(content, content[:, :1].repeat(59, 1), rtol=0, atol=1e-9)
    encoder = posprobe.profiles(str(folder), positions=30, window=5)
    assert encoder.stack == "encoder" and not encoder.causal and not np.allclose(encoder.profiles, profiles)
    assert encoder.toeplitz_by_construction and np.isnan(encoder.fhat_r2).all()  # exactly Toeplitz: R² not measured


@pytest.mark.parametrize("name, stack", [("t5", "encoder"), ("t5", "decoder"), ("deberta", "encoder")])
def test_fit_tisa_runs_on_t5_and_deberta(bias_checkpoints, tmp_path, name, stack):
    record = _json(["fit-tisa", str(bias_checkpoints[name]), "--kernels", "2", "--window", "6", "--layers", "0",
                    "--positions", "24", "--stack", stack, "--out", str(tmp_path), "--json"])  # fmt: skip
    assert record["mode"] == "content-free" and len(record["heads"]) == 4 and record["causal"] == (stack == "decoder")
    assert np.isfinite([h["r2"] for h in record["heads"]]).all()
    assert record["stack"] == (stack if name == "t5" else None)  # one-stack models: null; the decoder's files
    suffix = "_decoder" if stack == "decoder" else ""
    assert Path(record["kernels_file"]).name == f"tisa_kernels_S2{suffix}_layers0.safetensors"


@pytest.mark.slow
def test_stack_and_positions_do_not_apply_to_a_profiles_file(bias_checkpoints, tmp_path):
    out = tmp_path / "p"
    _json(["profiles", str(bias_checkpoints["t5"]), "--positions", "24", "--out", str(out), "--json"])
    npz = next(out.glob("*.npz"))
    with pytest.raises(PosprobeError, match="a .npz holds profiles already computed"):
        posprobe.fit_tisa(str(npz), kernels=2, window=6, stack="decoder")
    decoder = tmp_path / "d"  # a decoder's .npz keeps its stack through fit-tisa (file names, JSON)
    _json(["profiles", str(bias_checkpoints["t5"]), "--positions", "24", "--stack", "decoder", "--out", str(decoder),
           "--json"])  # fmt: skip
    fit = posprobe.fit_tisa(str(next(decoder.glob("*.npz"))), kernels=1, window=6)
    assert fit.stack == "decoder" and fit.causal


def test_fhat_mpnet_and_deberta_cli(bias_checkpoints, tmp_path):
    mp = _json(["fhat", str(bias_checkpoints["mpnet"]), "--layer", "-1", "--out", str(tmp_path / "m"), "--json"])
    assert mp["position_kind"] == "bucket_bias" and mp["n_positions"] == N and mp["causal"] is False
    de = _json(["fhat", str(bias_checkpoints["deberta"]), "--positions", "24", "--out", str(tmp_path / "d"),
                "--json"])  # fmt: skip
    assert de["position_kind"] == "disentangled" and de["n_positions"] == 24
    assert de["toeplitz_by_construction"] is True  # v3: no absolute input, exactly Toeplitz: R² not measured
    assert all(h["toeplitz_r2"] is None for h in de["heads"]) and de["mean_toeplitz_r2"] is None
    assert mp["toeplitz_by_construction"] is False and all(0 <= h["toeplitz_r2"] <= 1 for h in mp["heads"])


def test_toeplitz_reads_mpnet_table_and_points_t5_elsewhere(bias_checkpoints, tmp_path, capsys):
    result = posprobe.toeplitz(str(bias_checkpoints["mpnet"]))
    assert result.n_positions == N and result.dropped_rows == 2  # padding_idx + 1 reserved rows
    for name in ("t5", "deberta"):
        with pytest.raises(SystemExit) as info:
            main(["toeplitz", str(bias_checkpoints[name]), "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1 and "posprobe profiles" in err
        assert not (tmp_path / "o").exists()


def test_compare_mpnet_t5_deberta(bias_checkpoints, tmp_path):
    record = _json(["compare", *(str(bias_checkpoints[k]) for k in ("mpnet", "t5", "deberta")),
                    "--positions", "20", "--out", str(tmp_path), "--json"])  # fmt: skip
    mpnet, t5, deberta = record["models"]
    assert mpnet["toeplitz_r2"] is not None  # its absolute table, beside the bias
    assert t5["toeplitz_r2"] is None and deberta["toeplitz_r2"] is None
    assert {m["position_kind"] for m in record["models"]} == {"bucket_bias", "disentangled"}
    rows = list(posprobe.compare([str(bias_checkpoints[k]) for k in ("mpnet", "t5")], positions=20))
    assert [r.matrix_name for r in rows] == ["P", "mean F̂ over heads, layer 0"]  # the heatmap titles say which


def test_bad_stack_and_positions(bias_checkpoints):
    with pytest.raises(ArgumentValueError, match="no decoder"):
        posprobe.fhat(str(bias_checkpoints["mpnet"]), stack="decoder")
    with pytest.raises(ArgumentValueError, match="positions"):
        posprobe.fhat(str(bias_checkpoints["mpnet"]), positions=N + 1)
    with pytest.raises(ArgumentValueError, match="stack"):
        posprobe.fhat(str(bias_checkpoints["t5"]), stack="middle")
