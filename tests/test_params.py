"""Positional parameter counts (posprobe.analysis.params) against the seed paper's Table 2."""

from __future__ import annotations

import pytest

from posprobe.analysis.params import positional_parameter_counts
from posprobe.errors import PosprobeError


def test_bert_base_table2():
    import transformers as tf

    counts = positional_parameter_counts(tf.BertConfig().to_dict())
    assert (counts.n_positions, counts.table_width) == (512, 768)
    assert counts.absolute == 393_216 and counts.untied == 1_572_864
    assert counts.tisa == {1: 432, 3: 1_296, 5: 2_160}


def test_albert_base_table2_uses_embedding_size():
    import transformers as tf

    cfg = tf.AlbertConfig(embedding_size=128, hidden_size=768, num_attention_heads=12, intermediate_size=3072)
    counts = positional_parameter_counts(cfg.to_dict())
    assert counts.table_width == 128 and counts.hidden_size == 768
    assert counts.absolute == 65_536 and counts.untied == 98_304
    assert counts.tisa[5] == 2_160  # distinct TISA functions at all 12 depths despite shared weights


def test_longformer_base_table2():
    cfg = {
        "model_type": "longformer",
        "hidden_size": 768,
        "max_position_embeddings": 4098,
        "pad_token_id": 1,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
    }
    counts = positional_parameter_counts(cfg)
    assert counts.n_positions == 4096 and counts.reserved_rows == 2
    assert counts.absolute == 3_145_728 and counts.untied == 4_325_376 and counts.tisa[5] == 2_160


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "camembert"])
def test_roberta_family_reserved_rows(model_type):
    cfg = {
        "model_type": model_type,
        "hidden_size": 768,
        "max_position_embeddings": 514,
        "pad_token_id": 1,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
    }
    counts = positional_parameter_counts(cfg)
    assert counts.n_positions == 512 and counts.absolute == 393_216 and counts.untied == 1_572_864


def test_convolution_counts_brute_force():
    cfg = {
        "model_type": "bert",
        "hidden_size": 768,
        "max_position_embeddings": 512,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
    }
    for r in (1, 3, 8):
        counts = positional_parameter_counts(cfg, radius=r)
        offsets = range(-r, r + 1)  # kc = clip(j - i, -r, r) takes 2r+1 values
        fixed = sum(1 for _layer in range(12) for _head in range(12) for _k in offsets)
        dynamic = sum(1 for _layer in range(12) for _k in offsets for _dim in range(768 // 12))
        assert counts.fixed_conv == fixed and counts.dynamic_conv == dynamic
        assert counts.composite == fixed + dynamic
    assert positional_parameter_counts(cfg).fixed_conv == 12 * 17 * 12


def test_other_key_spellings():
    gpt2 = positional_parameter_counts(
        {"model_type": "gpt2", "n_embd": 768, "n_positions": 1024, "n_head": 12, "n_layer": 12}
    )
    assert gpt2.absolute == 1024 * 768 and gpt2.head_dim == 64
    distil = positional_parameter_counts(
        {"model_type": "distilbert", "dim": 768, "max_position_embeddings": 512, "n_heads": 12, "n_layers": 6},
        kernels=[5],
    )
    assert distil.tisa == {5: 3 * 5 * 12 * 6} and distil.fixed_conv == 12 * 17 * 6
    electra_small = positional_parameter_counts(
        {
            "model_type": "electra",
            "hidden_size": 256,
            "embedding_size": 128,
            "max_position_embeddings": 512,
            "num_attention_heads": 4,
            "num_hidden_layers": 12,
        }
    )
    assert electra_small.absolute == 512 * 128 and electra_small.dynamic_conv == 17 * 64 * 12


def test_to_json_is_plain():
    import json

    counts = positional_parameter_counts(
        {
            "model_type": "bert",
            "hidden_size": 32,
            "max_position_embeddings": 64,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
        }
    )
    record = json.loads(json.dumps(counts.to_json()))
    assert record["tisa"] == {"1": 24, "3": 72, "5": 120} and record["absolute"] == 2048
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        counts.absolute = 1  # frozen


@pytest.mark.parametrize(
    "cfg,kwargs",
    [
        ({"model_type": "bert", "hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12}, {}),  # no n
        ({"hidden_size": 768, "max_position_embeddings": 512, "num_hidden_layers": 12}, {}),  # no heads
        ({"hidden_size": 770, "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 1}, {}),
        ({"hidden_size": 768, "max_position_embeddings": "512", "num_attention_heads": 12, "num_hidden_layers": 1}, {}),
        (
            {
                "model_type": "roberta",
                "hidden_size": 768,
                "max_position_embeddings": 2,
                "pad_token_id": 1,
                "num_attention_heads": 12,
                "num_hidden_layers": 1,
            },
            {},
        ),
        (
            {"hidden_size": 768, "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 1},
            {"radius": -1},
        ),
        (
            {"hidden_size": 768, "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 1},
            {"radius": 0},  # one limit for the radius everywhere: 1..4096, as retrofit
        ),
        (
            {"hidden_size": 768, "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 1},
            {"kernels": [0]},
        ),
    ],
)
def test_bad_configs_raise(cfg, kwargs):
    with pytest.raises(PosprobeError) as info:
        positional_parameter_counts(cfg, **kwargs)
    assert info.value.hint


LLAMA = {
    "model_type": "llama",
    "hidden_size": 4096,
    "max_position_embeddings": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
}


def test_no_absolute_count_without_a_learned_table():
    """Issue 8: a Llama config reported 16,777,216 'absolute' parameters; it has rotary embeddings, no table."""
    counts = positional_parameter_counts(LLAMA)
    assert counts.absolute is None and counts.untied is None and not counts.has_learned_table
    assert counts.position_encoding == "rotary embeddings (RoPE)"
    assert counts.tisa[5] == 3 * 5 * 32 * 32  # what a retrofit would add is still counted
    record = counts.to_json()
    assert record["absolute"] is None and record["position_encoding"] == "rotary embeddings (RoPE)"
    sinusoidal = positional_parameter_counts(
        {
            "model_type": "distilbert",
            "sinusoidal_pos_embds": True,
            "dim": 768,
            "max_position_embeddings": 512,
            "n_heads": 12,
            "n_layers": 6,
        }
    )
    assert sinusoidal.absolute is None and "sinusoidal" in sinusoidal.position_encoding
    unknown = positional_parameter_counts({**LLAMA, "model_type": "somethingnew"})
    assert unknown.absolute is None and "unknown" in unknown.position_encoding


def test_all_nine_mechanisms_from_the_catalogue():
    """Brute-force counts per mechanism for BERT-base (r = 8, S = 5), from SPEC §5–8 by hand."""
    import transformers as tf

    from posprobe.mechanisms import MECHANISM_NAMES

    counts = positional_parameter_counts(tf.BertConfig().to_dict())
    H, dh, d, L, w = 12, 64, 768, 12, 17
    m = (H // 2) * dh
    expected = {
        "tisa": 3 * 5 * H * L,
        "fixed": H * w * L,
        "dynamic": w * dh * L,
        "composite": w * (dh + H) * L,
        "key-dynamic": w * dh * L,
        "shaw-values": w * dh * L,
        "depthwise": w * d * L,
        "conv-qkv": 3 * (d * w + m * d + m) * L,
        "cat": 3 * d * w * L,
    }
    assert list(counts.mechanisms) == list(MECHANISM_NAMES) and counts.mechanisms == expected
    assert counts.to_json()["formulas"]["cat"] == "L·3·d·(2r+1)"


def test_params_cli_without_a_learned_table(tmp_path):
    import json

    import numpy as np
    from safetensors.numpy import save_file
    from typer.testing import CliRunner

    from posprobe.cli import app

    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    save_file({"x": np.zeros(1, np.float32)}, str(tmp_path / "model.safetensors"))
    result = CliRunner().invoke(app, ["params", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "absolute learned" not in result.output and "rotary embeddings" in result.output
    assert "conv-qkv" in result.output and "16,777,216" not in result.output
    record = json.loads(CliRunner().invoke(app, ["params", str(tmp_path), "--json"]).stdout)
    assert record["absolute"] is None and set(record["mechanisms"]) >= {"cat", "depthwise", "shaw-values"}


def _family_cases():
    from family_models import CASES

    quick = {"opt", "mobilebert", "esm-rotary"}
    return [pytest.param(n, marks=() if n in quick else pytest.mark.slow) for n in sorted(CASES)]


@pytest.mark.parametrize("name", _family_cases())
def test_counts_equal_the_models_own_position_table(name):
    """Issue 22: `params` counts the learned table every family's model really has (its usable rows times its
    width: reserved and offset rows left out, MobileBERT's hidden-wide and RemBERT's input-wide tables), and no
    table where the model has none (rotary ESM, Falcon, ...)."""
    from family_models import build

    from posprobe.architectures.table import SINUSOIDAL
    from posprobe.families import family_for_type, position_kind
    from posprobe.families.context import reserved_rows

    model = build(name)
    config = model.config.to_dict()
    counts = positional_parameter_counts(config)
    family = family_for_type(config["model_type"])
    tables = [p for key, p in model.state_dict().items()  # whole name parts: not LUKE's entity_embeddings.*
              if family.position and (key == family.position or key.endswith("." + family.position))]  # fmt: skip
    if counts.absolute is None:  # no learned table: none stored, or the fixed sin/cos table of Marian and Pegasus
        assert not tables or position_kind(config)[0] == SINUSOIDAL
        return
    if not tables and config.get(family.tensors.get("axial_switch", "")):  # Reformer's axial factor tables
        factors = [p for key, p in model.state_dict().items() if ".position_embeddings.weights." in key]
        assert len(factors) == 2 and counts.absolute == sum(p.numel() for p in factors)
        return
    (table,) = tables
    usable = table.shape[0] - reserved_rows(config, name) - family.position_offset
    assert (counts.n_positions, counts.table_width) == (usable, table.shape[1])
    assert counts.absolute == usable * table.shape[1]
