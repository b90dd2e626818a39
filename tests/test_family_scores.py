"""SPEC §9 parity: for every analysable family of the family table (and the config switches that change how one
reads), posprobe's content-free scores, read lazily from the saved checkpoint, equal the real attention module's
pre-softmax scores on the constant sequence of the average word embedding, every layer, float64; and the pairs the
model's softmax sees are exactly those posprobe's layer kinds (causality, local windows) say."""

from __future__ import annotations

import numpy as np
import pytest
from family_models import CASES, case, reference_scores

import posprobe
from posprobe.checkpoint import WeightReader, resolve_model
from posprobe.families import FAMILIES, family_for_type
from posprobe.families.context import ModelContext, content_free_scores
from posprobe.families.table import SCORE_MODULES, SINUSOIDAL, TABLE_KINDS

N = 16
# Kept in the default run: one case of each reading path; the rest run in the slow tier (CI).
QUICK = {"llama", "gemma3_text", "codegen", "falcon-new", "bloom", "opt", "mobilebert", "longformer",
         "deberta-absolute", "marian"}  # fmt: skip
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
    ours = np.stack([content_free_scores(ctx, layer, N) for layer in range(ctx.layers())])
    ref = reference_scores(model, N)
    assert ours.shape == ref.scores.shape == (2, ctx.shape.heads, N, N)
    # the pairs the model's softmax sees are those posprobe's layer kinds and causality say
    k = np.arange(N)[None, :] - np.arange(N)[:, None]
    kinds = ctx.layer_kinds(N)
    for layer, kind in enumerate(kinds):
        expected = np.vectorize(kind.allows)(k) & ((k <= 0) if ctx.causal() else True)
        np.testing.assert_array_equal(ref.allowed[layer], expected, err_msg=f"{name} layer {layer}: {kind}")
    allowed = ref.allowed[:, None]
    tolerance = 1e-4 if name in ("xglm",) else 1e-5
    if c.compare == "exact":
        diff = np.where(allowed, ours - ref.scores, 0.0)
        assert np.abs(diff).max() <= tolerance * max(1.0, np.abs(ours).max()), name
    else:  # equal up to a constant per query row on the pairs the model attends
        diff = np.where(allowed, ours - ref.scores, np.nan)
        assert np.nanmax(np.nanmax(diff, -1) - np.nanmin(diff, -1)) < tolerance, name
    assert np.std(ours[..., N // 2, :]) > 0  # positions really matter in the test model
    if ctx.kind == SINUSOIDAL:  # a sinusoidal P is exactly Toeplitz (known answer)
        result = posprobe.toeplitz(str(tmp_path))
        assert result.toeplitz_r2 > 1 - 1e-9 and result.n_positions == 64
