"""Toeplitz by construction (issue 19): where the position kind makes the content-free scores depend on k = j - i
alone (rotary, ALiBi, T5-style buckets, DeBERTa without an absolute input), results say so instead of reporting
R² = 1 as a finding. The flag comes from the score modules, never from the numbers; these tests check the numbers
agree with it for every kind, that it is off where an absolute table enters (learned, sinusoidal, MPNet, DeBERTa-v2
with `position_biased_input`), and off for an input that differs along the sequence."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as tf
from family_models import CASES as FAMILY_CASES
from family_models import DESIGNS_QUICK, ISSUE_34_CASES, build, case
from test_families_bias import DEBERTA_V2_OLD, DEBERTA_V3, _randomise, _t5_stack

import posprobe
from posprobe.architectures.table import ALIBI, BUCKET_BIAS, NOPE, RELATIVE_SINUSOIDAL, ROTARY, position_kind
from posprobe.checkpoint.in_memory import StateDictReader, source_from_model
from posprobe.families.context import PER_POSITION_INPUT, SAME_INPUT, ModelContext, toeplitz_by_construction

N = 24


def _bias_model(name: str):
    if name in ("t5", "umt5"):
        return _t5_stack(name, "encoder")[0]
    if name == "mpnet":
        torch.manual_seed(0)
        cfg = tf.MPNetConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=37, max_position_embeddings=N + 2)  # fmt: skip
        return _randomise(tf.MPNetForMaskedLM(cfg))
    variant = DEBERTA_V3 if name == "deberta-v3" else DEBERTA_V2_OLD
    torch.manual_seed(0)
    cfg = tf.DebertaV2Config(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=37, max_position_embeddings=N, **variant)  # fmt: skip
    return _randomise(tf.DebertaV2Model(cfg))


def _by_kind(name: str) -> bool:
    """Rotary, ALiBi, NoPE, bucket-bias (CPM-Ant) and sinusoidal relative test models (tests/family_models.py) are
    Toeplitz by construction; absolute tables are not."""
    c = case(name)
    if {**c.config, **c.config.get("text_config", {})}.get("attn_temperature_tuning"):  # Llama 4 (and its wrapper):
        # its NoPE layers scale each query by its position
        return False
    if c.model_type.startswith("hunyuan_v1"):  # q/k norms with weights act on the rotated q and k
        return False
    if c.model_type == "dory":  # the rotated query is rescaled per channel
        return False
    if c.model_type == "beam":  # its NoPE layers scale each query by its position
        return False
    if c.model_type == "funnel" and c.config.get("separate_cls", True):  # <cls> (position 0) kept out of positions
        return False
    if c.model_type == "zaya":  # q and k mixed by convolutions along the sequence: the first positions differ
        return False
    toeplitz_kinds = (ROTARY, ALIBI, NOPE, BUCKET_BIAS, RELATIVE_SINUSOIDAL)
    return position_kind({**c.config, "model_type": c.model_type})[0] in toeplitz_kinds


# family -> (how to build it, stacks, Toeplitz by construction?): every case of the family test matrix, and the
# bucket-bias and disentangled models of test_families_bias
CASES = {
    **{name: (lambda f=name: build(f), (case(name).stack,), _by_kind(name)) for name in FAMILY_CASES},
    "bert": (lambda: build_bert(), ("encoder",), False),
    "t5": (lambda: _bias_model("t5"), ("encoder", "decoder"), True),
    "umt5": (lambda: _bias_model("umt5"), ("encoder",), True),
    "mpnet": (lambda: _bias_model("mpnet"), ("encoder",), False),  # its absolute table enters the input
    "deberta-v3": (lambda: _bias_model("deberta-v3"), ("encoder",), True),
    "deberta-v2-absolute-input": (lambda: _bias_model("deberta-v2"), ("encoder",), False),  # position_biased_input
}
assert {name for name, (_, _, flag) in CASES.items() if flag} >= {"llama", "gptj", "bloom", "falcon-alibi"}
assert not CASES["marian"][2] and not CASES["xglm"][2] and not CASES["opt"][2]


def build_bert():
    from conftest import build_tiny

    return build_tiny("bert")


def _deviation_from_toeplitz(matrices: np.ndarray) -> float:
    """max |A - A_T| / max |A| over heads, A_T the diagonal means (computed here, independently of posprobe)."""
    worst = 0.0
    n = matrices.shape[-1]
    for a in matrices:
        fit = np.empty_like(a)
        for k in range(-(n - 1), n):
            diag = np.diagonal(a, offset=k)
            idx = np.arange(diag.size)
            rows, cols = (idx, idx + k) if k >= 0 else (idx - k, idx)
            fit[rows, cols] = diag.mean()
        worst = max(worst, float(np.abs(a - fit).max() / max(np.abs(a).max(), 1e-300)))
    return worst


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow if n in ISSUE_34_CASES - DESIGNS_QUICK else ()) for n in sorted(CASES)],
)
def test_flag_matches_the_matrices_for_every_kind(name):
    make, stacks, expected = CASES[name]
    model = make()
    for stack in stacks:
        result = posprobe.fhat(model, layer=-1, positions=N, stack=stack)
        assert result.toeplitz_by_construction is expected, (name, stack)
        deviation = _deviation_from_toeplitz(result.matrices)
        if expected:
            # really Toeplitz, whatever the random weights (up to the float32 rotary angles the model itself uses)
            assert deviation < 1e-5, (name, stack, deviation)
            assert np.isnan(result.toeplitz_r2).all() and result.mean_toeplitz_r2 is None
            record = json.loads(result.to_json())
            assert record["toeplitz_by_construction"] is True and all(h["toeplitz_r2"] is None for h in record["heads"])
        else:
            assert deviation > 1e-6, (name, stack, deviation)  # an absolute table: not Toeplitz, R² is a finding
            assert np.isfinite(result.toeplitz_r2).all() and (result.toeplitz_r2 < 1 - 1e-9).all()
        ctx = ModelContext(source_from_model(model), StateDictReader(model))
        assert toeplitz_by_construction(ctx, stack, SAME_INPUT) is expected
        assert toeplitz_by_construction(ctx, stack, PER_POSITION_INPUT) is False  # issue 20's position-mean input


def test_profiles_and_compare_carry_the_flag(tmp_path):
    llama, bert = build("llama"), build_bert()
    p = posprobe.profiles(llama, layers=[0, 1], positions=N, window=5)
    assert p.toeplitz_by_construction and np.isnan(p.fhat_r2).all()
    record = json.loads(p.to_json())
    assert record["toeplitz_by_construction"] is True and all(h["toeplitz_r2"] is None for h in record["heads"])
    window = p.profiles[:, :, None, N - 1 - 5 : N + 5]  # every section equals the profile
    np.testing.assert_allclose(p.sections, np.broadcast_to(window, p.sections.shape), atol=1e-5 * np.abs(window).max())
    rows = list(posprobe.compare([bert, llama], positions=N))
    assert [r.toeplitz_by_construction for r in rows] == [False, True]
    assert rows[0].mean_fhat_r2 is not None and rows[1].mean_fhat_r2 is None


def test_text_figure_and_json_say_it(tmp_path):
    from typer.testing import CliRunner

    from posprobe.cli import app

    folder = tmp_path / "llama"
    build("llama").save_pretrained(folder)
    runner = CliRunner()
    text = runner.invoke(app, ["fhat", str(folder), "--positions", str(N), "--out", str(tmp_path / "f")])
    assert text.exit_code == 0, text.output
    assert "Toeplitz by construction" in text.output and "1.0000" not in text.output
    mosaic = posprobe.fhat(str(folder), positions=N).plot()
    labels = [label[2] for label in mosaic.labels] if hasattr(mosaic, "labels") else []
    assert "Toeplitz by construction" in mosaic.title and not any("R²" in label for label in labels)
    out = runner.invoke(app, ["compare", str(folder), str(folder), "--positions", str(N), "--out", str(tmp_path / "c")])
    assert out.exit_code == 0 and "by constr." in out.output
    profiles = runner.invoke(app, ["profiles", str(folder), "--positions", str(N), "--out", str(tmp_path / "p")])
    assert profiles.exit_code == 0 and "Toeplitz by construction" in profiles.output
    with np.load(next((tmp_path / "p").glob("*.npz"))) as z:
        assert json.loads(str(z["metadata"]))["toeplitz_by_construction"] is True and np.isnan(z["fhat_r2"]).all()
