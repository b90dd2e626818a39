"""SPEC §9 parity: for every analysable family of the family table, posprobe's content-free scores (read lazily
from the saved checkpoint) equal the real attention module's pre-softmax scores on the constant sequence of
the average word embedding, every layer, float64."""

from __future__ import annotations

import numpy as np
import pytest
from family_models import LEARNED_EXTRA, MATRIX, SINUSOIDAL, build, model_scores

import posprobe
from posprobe.checkpoint import WeightReader, resolve_model
from posprobe.families import FAMILIES
from posprobe.families.context import ModelContext, content_free_scores
from posprobe.families.table import SCORE_MODULES, TABLE_KINDS

N = 16


def test_matrix_covers_every_analysable_family():
    """Adding a family = one table entry + one tiny config here; a family without one fails this test."""
    wanted = {f.name for f in FAMILIES if f.analysable and f.kind not in TABLE_KINDS and f.kind in SCORE_MODULES}
    tested_elsewhere = {"t5", "umt5", "mpnet", "deberta-v2"}  # their own parity tests (tests/test_families_bias.py)
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


@pytest.mark.parametrize("family", sorted(SINUSOIDAL) + sorted(LEARNED_EXTRA))
def test_sinusoidal_tables_equal_the_model(family, tmp_path):
    """Sinusoidal (and learned-table families without a conftest fixture) go through the table path:
    faithful-mode F_hat_P (E_P built as the model builds it, word embeddings scaled as it scales them) equals
    the model's scores; a sinusoidal P is exactly Toeplitz (known answer)."""
    import torch

    # XGLM's eager attention cannot run in float64 (it clamps with a float32 constant): float32, looser bound.
    model = build(family, torch.float32 if family == "xglm" else torch.float64)
    tolerance = 1e-4 if family == "xglm" else 1e-5
    model.save_pretrained(tmp_path)
    ours = np.stack([posprobe.fhat(str(tmp_path), layer=l, mode="faithful", positions=N).matrices for l in (0, 1)])
    theirs, exact = model_scores(model, N)
    if exact:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6 * np.abs(theirs).max())
    else:
        allowed = np.tril(np.ones((N, N), dtype=bool)) if family == "xglm" else np.ones((N, N), dtype=bool)
        diff = np.where(allowed, ours - theirs, np.nan)
        assert np.max(np.nanmax(diff, -1) - np.nanmin(diff, -1)) < tolerance
    if family in SINUSOIDAL:
        result = posprobe.toeplitz(str(tmp_path))
        assert result.toeplitz_r2 > 1 - 1e-9 and result.n_positions == 64  # sum_f cos(w_f (i - j)): Toeplitz
        assert posprobe.fhat(str(tmp_path)).position_kind == "sinusoidal"
