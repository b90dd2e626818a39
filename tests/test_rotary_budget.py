"""`posprobe rotary`: the rotary budget of SPEC §17 (from the config alone where there are no weights) and each
layer read against the context it sees (issue 38 item 7: a sliding-window layer sees its window, not the model's
maximum)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from family_models import build

import posprobe
from posprobe.analysis.context_loss import rotary_budget
from posprobe.analysis.rotary_bands import long_band_share


def test_sliding_layers_are_read_against_their_window():
    """Gemma 3 (tiny): layer 0 slides over 5 tokens, layer 1 is global (64 positions). The long-band share of layer 0
    counts bands longer than 5 tokens, layer 1's bands longer than 64, each equal to the pure function with that
    context; the content-free equal-norm fraction likewise."""
    result = posprobe.rotary(build("gemma3_text"), positions=32)
    assert result.layer_windows == [5, None] and result.layer_contexts == [5, 64]
    for i, context in enumerate((5, 64)):
        expected = long_band_share(result.q_band_norm[i], result.wavelengths[i], context)
        np.testing.assert_allclose(result.long_band_share("q")[i], expected)
        assert result.long_band_fraction()[i] == pytest.approx((result.wavelengths[i] > context).mean())
    # layer 0's bands: wavelengths 2 pi 100^(f/4) = 6.3 .. 201 tokens: every one exceeds the 5-token window
    assert result.long_band_fraction()[0] == 1.0
    assert result.to_dict()["layer_contexts"] == [5, 64]
    assert result.long_band_fraction(context=1000)[0] == 0.0  # an explicit context still overrides


def test_global_models_keep_the_model_context():
    result = posprobe.rotary(build("llama"))
    assert result.layer_windows == [None, None] and result.layer_contexts == [result.context] * 2


def test_budget_in_rotary_equals_the_closed_form():
    """Tiny Llama with its own llama3 scaling: the budget reads theta, the trained length (the original length of
    its rope parameters) and the rotated dims from the config, and each variant's wavelengths from the family's
    own rotary module ('none': the model's, as the bands use; linear:2: twice the unscaled wavelengths)."""
    model = build("llama")
    result = posprobe.rotary(model, rope_scaling="none,linear:2")
    b = result.budget
    params = model.config.rope_parameters
    trained = params.get("original_max_position_embeddings") or model.config.max_position_embeddings
    assert b["trained_length"] == trained and b["rope_theta"] == params["rope_theta"]
    closed = rotary_budget(8, params["rope_theta"], trained)
    assert b["critical_dimension"] == closed["critical_dimension"]
    assert b["extrapolation_limit"] == pytest.approx(closed["extrapolation_limit"])
    none, linear = (np.asarray(v["wavelengths"]) for v in b["variants"])
    np.testing.assert_allclose(none, result.wavelengths[0], rtol=1e-5)  # the model's own, as the bands use
    default = 2 * np.pi * params["rope_theta"] ** (np.arange(0, 8, 2) / 8)
    np.testing.assert_allclose(linear, 2 * default, rtol=1e-6)


def test_budget_of_layers_of_one_type_reads_that_types_rope_setting():
    """Laguna (tiny): sliding layers 0 and 2 rotate all 8 dims at base 100, global layers 1 and 3 half of them at
    base 1000. The budget of the sliding layers reads their own setting (base, rotated dims, the wavelengths the
    bands use); that of the global layers the global setting, as before; a variant changes the global setting
    only."""
    import torch

    model = build("laguna", torch.float32)
    params = model.config.rope_parameters
    for layers, kind, dims in (([0, 2], "sliding_attention", 8), ([1, 3], "full_attention", 4)):
        result = posprobe.rotary(model, layers=layers, rope_scaling="none,linear:2")
        b = result.budget
        theta = params[kind]["rope_theta"]
        assert b["layer_type"] == kind and b["rope_theta"] == theta and b["rotated_dims"] == dims
        closed = rotary_budget(dims, theta, b["trained_length"])
        assert b["critical_dimension"] == closed["critical_dimension"]
        none, linear = (np.asarray(v["wavelengths"]) for v in b["variants"])
        np.testing.assert_allclose(none, result.wavelengths[0], rtol=1e-5)  # the wavelengths the bands use
        np.testing.assert_allclose(linear, none * (2 if kind == "full_attention" else 1), rtol=1e-6)


@pytest.fixture
def llama2_config_folder(tmp_path):
    """Llama-2-7B's config (d_h 128, theta 10000, 4096 positions), saved without weights."""
    import transformers as tf

    config = tf.LlamaConfig(hidden_size=4096, num_attention_heads=32, num_hidden_layers=32, intermediate_size=11008,
                            max_position_embeddings=4096, rope_theta=10000.0, vocab_size=32000)  # fmt: skip
    config.save_pretrained(tmp_path / "llama-2-7b-config")
    return tmp_path / "llama-2-7b-config"


def test_config_only_folder_gets_the_budget(llama2_config_folder, tmp_path):
    """`posprobe rotary` on a folder with config.json alone: Llama-2-7B's budget (92 / about 4,712, Liu et al.
    2023), the variants' wavelengths, a note that band norms need weights, and no file written."""
    from typer.testing import CliRunner

    from posprobe.cli import app

    out = tmp_path / "never"
    args = ["rotary", str(llama2_config_folder), "--rope-scaling", "none,yarn:4", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["mode"] == "config-only" and "band norms need the weights" in record["note"]
    budget = record["budget"]
    assert budget["critical_dimension"] == 92 and round(budget["extrapolation_limit"]) == 4712
    assert budget["trained_length"] == 4096 and budget["rotated_dims"] == 128
    assert [v["variant"] for v in budget["variants"]] == ["none", "yarn:4"]
    assert budget["variants"][0]["pairs_beyond_trained_length"] == 64 - 46
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0 and "critical dimension 92" in text.output and "need the weights" in text.output
    assert not out.exists()


def test_config_only_folder_refuses_text(llama2_config_folder, tmp_path, capsys):
    from posprobe.cli import main

    texts = tmp_path / "t.txt"
    texts.write_text("a b c\n")
    with pytest.raises(SystemExit) as info:
        main(["rotary", str(llama2_config_folder), "--text", str(texts), "--out", str(tmp_path / "never")])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "holds only a config" in err and "\n" not in err
