"""Entries pooled over blocks of tokens beside a layer's keys (DeepSeek V4's compressed layers, SPEC §9, §14): not
positions, so not in F̂; on text the raw keys' probabilities are the model's own and the pooled entries' share counts
with the learned sink's; the content-free sink share is given only where no pooled entry shares the softmax.
Score parity and the capture against each text alone: tests/test_family_scores.py, tests/test_capture_families.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from family_models import build

import posprobe
from posprobe.analysis.learned_sinks import LearnedSinkAccumulator
from posprobe.capture import capture
from posprobe.checkpoint import WeightReader, resolve_model
from posprobe.families.context import ModelContext


def _context(path) -> ModelContext:
    source = resolve_model(str(path))
    return ModelContext(source, WeightReader(source.path, source.weight_format), mode="faithful")


def _eager_attentions(model, ids: list[int]) -> list[np.ndarray]:
    """The model's own eager attention on one text: (H, n, n + pooled entries) per layer, the sink column dropped."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    return [a[0].double().numpy() for a in out.attentions]


def test_layer_kinds_name_the_pooled_entries_and_each_rope_setting(tmp_path):
    build("deepseek_v4").save_pretrained(tmp_path)
    words = [kind.describe() for kind in _context(tmp_path).layer_kinds(16)]
    assert words[0] == "local |k| <= 5, rope theta 100"
    assert words[1] == (
        "local |k| <= 5, rope theta 1000, plus entries pooled over blocks of 4 tokens (not positions; not in F̂)"
    )
    assert "blocks of 8 tokens" in words[2] and "rope theta 1000" in words[2]


def test_the_pooled_entries_share_counts_with_the_sinks():
    """`attention`'s share not left to real tokens is the sink's plus the pooled entries': one minus the raw keys'
    probabilities of the model's own eager attention, each text alone; the compressed layers' pooled entries take a
    share of their own there (so the test sees them)."""
    model = build("deepseek_v4")
    texts = [[5, 9, 13, 40, 41, 7, 30, 31, 50, 51], [11, 12, 60, 61, 62, 63, 64, 9, 8], [70, 71, 72]]
    acc = LearnedSinkAccumulator(3, 4)
    capture(model, [acc], input_ids=texts, max_length=16, batch_size=2)
    got = acc.result()
    eager = [_eager_attentions(model, ids) for ids in texts]
    rows = [[1.0 - a[..., : len(ids)].sum(-1) for a in layers] for ids, layers in zip(texts, eager)]
    expected = np.stack([np.concatenate([r[layer] for r in rows], -1).mean(-1) for layer in range(3)])  # (L, H)
    np.testing.assert_allclose(got.learned_sink_share, expected, atol=1e-6)
    pooled = [sum(a[..., len(ids) :].sum() for ids, layers in zip(texts, eager) for a in layers[layer:layer + 1])
              for layer in range(3)]  # fmt: skip
    assert pooled[0] == 0 and pooled[1] > 0.01 and pooled[2] > 0.01


def _layer_zero_sink_share(model, n: int) -> np.ndarray:
    """(H,) the mean share layer 0's sink takes on the constant sequence of the average word, from the model's own
    eager attention (layer 0 reads the embedding-level input itself)."""
    with torch.no_grad():
        model.get_input_embeddings().weight[0] = model.get_input_embeddings().weight.mean(0)
    return (1.0 - _eager_attentions(model, [0] * n)[0][..., :n].sum(-1)).mean(-1)


def test_the_content_free_sink_share_is_given_only_without_pooled_entries(tmp_path):
    """A sliding layer (no pooled entries): the model's own sink share on the constant sequence; a compressed layer:
    null (NaN) from n = its block size on, and below it (no block complete, no pooled entry) the model's own."""
    from family_models import CASES

    model_type, config, options = CASES["deepseek_v4"]
    layer_types = ["compressed_sparse_attention", "sliding_attention", "heavily_compressed_attention"]
    CASES["deepseek_v4-csa-first"] = (model_type, {**config, "layer_types": layer_types}, options)
    try:
        first_compressed = build("deepseek_v4-csa-first")
    finally:
        del CASES["deepseek_v4-csa-first"]
    for model, path in ((build("deepseek_v4"), tmp_path / "sliding"), (first_compressed, tmp_path / "csa")):
        model.save_pretrained(path)
        result = posprobe.profiles(str(path), positions=16)
        shares = json.loads(result.to_json())["content_free_learned_sink_share"]
        nulls = [layer for layer, row in enumerate(shares) if row == [None] * 4]
        assert nulls == ([0, 2] if model is first_compressed else [1, 2])
        assert sum(None in row for row in shares) == 2  # the sliding layer's shares are all numbers
        short = posprobe.profiles(str(path), positions=3)  # fewer positions than a block: no pooled entry
        assert np.isfinite(short.learned_sink_share).all()
        np.testing.assert_allclose(short.learned_sink_share[0], _layer_zero_sink_share(model, 3), atol=1e-6)
        if model is not first_compressed:
            np.testing.assert_allclose(result.learned_sink_share[0], _layer_zero_sink_share(model, 16), atol=1e-6)


def test_needle_reads_the_raw_keys_rows():
    """`posprobe needle` runs the layers with their own masks over the pooled entries (the eager path's additive
    masks, which each compressed layer extends with the entries' bias) and reads the raw keys' share of the last
    prompt token's row (rows against the recorded attention: tests/test_needle_sinks.py)."""
    from test_needle import HAYSTACK, char_tokenizer
    from test_needle_sinks import causal_lm

    from posprobe.pipelines.needle import NeedleGrid
    from posprobe.pipelines.needle_prompts import NeedleTask

    model = causal_lm("deepseek_v4")
    task = NeedleTask(intro="", needle=" K{answer}.", question=" K", answer="7")
    grid = NeedleGrid(lengths=(40,), depths=(0.0, 1.0), trials=1)
    result = posprobe.needle(model, tokenizer=char_tokenizer(), haystack=HAYSTACK, grid=grid, task=task)
    attention = result.needle_attention  # (lengths, depths, trials, L, H)
    assert attention.shape[-2:] == (3, 4) and np.isfinite(attention).all() and (attention > 0).any()


@pytest.mark.slow
def test_a_released_style_config_reads_as_its_config_class_folds_it(tmp_path):
    """The released configs' legacy keys (a compression ratio per layer, qk_rope_head_dim, YaRN in rope_scaling),
    folded by transformers into layer types, compress_rates and a YaRN 'compress' rope: F̂ over the raw keys is the
    model's own in every layer (the parity harness of tests/test_family_scores.py)."""
    from family_models import CASES, reference_scores

    from posprobe.families.context import content_free_scores

    model_type, config, options = CASES["deepseek_v4"]
    config = {k: v for k, v in config.items() if k not in ("layer_types", "compress_rates", "partial_rotary_factor")}
    config |= dict(num_hidden_layers=4, compress_ratios=[0, 4, 128, 4], compress_rate_hca=8, qk_rope_head_dim=4,
                   rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16))  # fmt: skip
    CASES["deepseek_v4-released"] = (model_type, config, options)
    try:
        model = build("deepseek_v4-released")
    finally:
        del CASES["deepseek_v4-released"]
    model.save_pretrained(tmp_path)
    ctx = _context(tmp_path)
    n = 16
    words = [kind.describe() for kind in ctx.layer_kinds(n)]
    assert "yarn rope theta 1000" in words[1] and "blocks of 8 tokens" in words[2] and "yarn" not in words[0]
    ours = np.stack([content_free_scores(ctx, layer, n) for layer in range(4)])
    ref = reference_scores(model, n)
    diff = np.where(ref.allowed[:, None], ours - ref.scores, 0.0)
    assert np.abs(diff).max() <= 1e-5 * np.abs(ours).max()
