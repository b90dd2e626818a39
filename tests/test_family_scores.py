"""SPEC §9 parity: for every analysable family of the family table, posprobe's content-free scores (read lazily
from the saved checkpoint) equal the real attention module's pre-softmax scores on the constant sequence of
the average word embedding, every layer, float64."""

from __future__ import annotations

import numpy as np
import pytest
from family_models import MATRIX, build, model_scores

from posprobe.checkpoint import WeightReader, resolve_model
from posprobe.families import FAMILIES, ModelContext, content_free_scores
from posprobe.families.table import LEARNED, SCORE_MODULES

N = 16


def test_matrix_covers_every_analysable_family():
    """Adding a family = one table entry + one tiny config here; a family without one fails this test."""
    wanted = {f.name for f in FAMILIES if f.analysable and f.kind != LEARNED and f.kind in SCORE_MODULES}
    tested_elsewhere = {"t5", "umt5", "mpnet", "deberta-v2", "sinusoidal-seq2seq"}  # part B / sinusoidal tests
    assert wanted - tested_elsewhere <= set(MATRIX)


@pytest.mark.parametrize("family", sorted(MATRIX))
def test_content_free_scores_equal_the_model(family, tmp_path):
    model = build(family)
    model.save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format))
    ours = np.stack([content_free_scores(ctx, layer, N) for layer in range(ctx.layers())])
    theirs, exact = model_scores(model, N)
    assert ours.shape == theirs.shape == (2, model.config.num_attention_heads, N, N)
    if exact:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6 * np.abs(theirs).max())
    else:  # log-probabilities: equal up to a per-row constant on the causal pairs
        causal = np.tril(np.ones((N, N), dtype=bool))
        diff = np.where(causal, ours - theirs, np.nan)
        spread = np.nanmax(diff, -1) - np.nanmin(diff, -1)
        assert np.max(spread) < 1e-5
    assert ctx.causal()
    assert np.std(ours[..., 0, :]) > 0  # positions really matter in the test model
