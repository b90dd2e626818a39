"""Integration: the packaged all-MiniLM-L6-v2 checkpoint (real weights, no network)."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from posprobe.analysis.toeplitz import toeplitz_r2
from posprobe.cli import app
from posprobe.pipelines.weights import fhat as fhat_analysis
from posprobe.pipelines.weights import profiles as compute_profiles
from posprobe.pipelines.weights import toeplitz as toeplitz_analysis

pytestmark = pytest.mark.integration


def test_minilm_toeplitz_and_fhat_against_the_full_model():
    import torch
    from transformers import AutoModel

    from posprobe.checkpoint import default_model_dir

    t = toeplitz_analysis(None)
    assert t.model == "all-MiniLM-L6-v2" and t.n_positions == 512 and set(t.blocks) == {128}
    # the naive way: load the whole model and compute P with torch
    model = AutoModel.from_pretrained(default_model_dir())
    e = model.embeddings.position_embeddings.weight.detach().double()
    p = (e @ e.T).numpy()
    np.testing.assert_allclose(t.matrix, p, rtol=1e-12, atol=1e-12)
    assert t.toeplitz_r2 == pytest.approx(toeplitz_r2(p), abs=1e-12)
    # known values (README, paper Table 1 style): P R² 0.4742, leading 128 x 128 block 0.3242
    assert round(t.toeplitz_r2, 4) == 0.4742 and round(t.blocks[128], 4) == 0.3242
    f = fhat_analysis(None, 0, "paper")
    assert f.matrices.shape == (12, 512, 512) and round(float(np.mean(f.toeplitz_r2)), 4) == 0.5499
    del torch


def test_minilm_cli_json(tmp_path):
    result = CliRunner().invoke(app, ["fhat", "--json", "--out", str(tmp_path), "--mode", "faithful"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["model"] == "all-MiniLM-L6-v2" and record["mode"] == "faithful" and len(record["heads"]) == 12


def test_minilm_profiles_all_layers():
    res = compute_profiles(None, mode="paper")
    assert res.profiles.shape == (6, 12, 1023) and res.offsets[0] == -511


@pytest.mark.slow
def test_minilm_tisa_fit_known_median():
    """The default S = 5 fit of every head (window k = -16..16): median R² 0.9915 (benchmarks/RESULTS.md §2)."""
    from posprobe.pipelines.fitting import fit_tisa

    result = fit_tisa(None, kernels=5)
    assert result.window == 16 and result.fits[0].r2.shape == (6, 12)
    assert round(result.fits[0].median_r2, 4) == 0.9915
