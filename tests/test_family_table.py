"""The family table is the one source of family knowledge: params, analyses, retrofit and config checks agree."""

from __future__ import annotations

import json
import shutil

import pytest

from posprobe.analysis.params import positional_parameter_counts
from posprobe.architectures.table import LEARNED, OTHER, ROTARY, TABLE_KINDS
from posprobe.cli import main
from posprobe.errors import PosprobeError
from posprobe.families import FAMILIES, family_for_type, model_types, position_kind
from posprobe.families.context import SCORE_MODULES


def test_every_model_type_has_one_entry_and_known_kind():
    seen = [t for f in FAMILIES for t in f.model_types]
    assert len(seen) == len(set(seen))
    for family in FAMILIES:
        assert family.mechanism  # every entry can say what it uses
        if family.analysable and family.kind not in TABLE_KINDS:
            assert family.kind in SCORE_MODULES


def test_known_transformers_types():
    """Every entry names a model type transformers knows (no typos in the table)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    unknown = [t for f in FAMILIES for t in f.model_types if t not in CONFIG_MAPPING_NAMES]
    assert unknown == []


def test_params_and_analyses_read_the_same_table():
    """Issue 9: the learned-table knowledge of `params` and of the analyses came from two lists."""
    from posprobe.architectures.table import table_model_types
    from posprobe.retrofitting.install import RETROFIT_MODEL_TYPES

    assert set(RETROFIT_MODEL_TYPES) <= set(table_model_types())
    for model_type in model_types():
        config = {"model_type": model_type, "hidden_size": 32, "max_position_embeddings": 64,
                  "num_attention_heads": 4, "num_hidden_layers": 2}  # fmt: skip
        counts = positional_parameter_counts(config)
        learned = family_for_type(model_type).learned_table
        assert (counts.absolute is not None) == learned, model_type
        if model_type in table_model_types():  # tables posprobe reads: learned ones count, built ones don't
            assert (counts.absolute is not None) == (family_for_type(model_type).kind == LEARNED)
    llama = positional_parameter_counts({**config, "model_type": "llama"})
    assert llama.absolute is None and position_kind({"model_type": "llama"})[0] == ROTARY


@pytest.mark.slow  # every model type's default config
def test_params_reads_each_familys_own_config():
    """`params` on a family's own default config (its own key names: BLOOM `n_head`, T5 `d_kv`/`num_layers`, no
    position limit for ALiBi and bucket models) counts every mechanism; it failed on BLOOM, MPT and T5."""
    from transformers import AutoConfig

    for family in FAMILIES:
        if family.kind == OTHER:  # named in messages only (funnel, reformer, ... have their own layouts)
            continue
        for model_type in family.model_types:
            config = AutoConfig.for_model(model_type).to_dict()
            if model_type == "glm4_moe":  # its default config gives 96 heads of a 4096 width and no head_dim (the
                config["head_dim"] = 128  # model floors 4096 / 96); GLM-4.5 checkpoints state head_dim 128
            if family.reserved_rows is True and config.get("pad_token_id") is None:  # ESM's default: no padding id,
                continue  # so it cannot number positions (refused, as test_null_pad_token_id_is_refused... checks)
            counts = positional_parameter_counts(config)
            assert counts.mechanisms["tisa"] == 3 * 5 * counts.n_heads * counts.n_layers, model_type
            assert (counts.absolute is not None) == family.learned_table, model_type


@pytest.mark.parametrize("command", ["params", "toeplitz"])
def test_null_pad_token_id_is_refused_the_same_way_everywhere(tiny_checkpoints, tmp_path, command, capsys):
    """Issue 9: `pad_token_id: null` in a RoBERTa config crashed one command and not the other."""
    folder = tmp_path / "r"
    shutil.copytree(tiny_checkpoints["roberta"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["pad_token_id"] = None
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as info:
        main([command, str(folder)] + (["--out", str(tmp_path / "o")] if command == "toeplitz" else []))
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("posprobe: error:") and "pad_token_id" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()
    with pytest.raises(PosprobeError, match="pad_token_id"):
        positional_parameter_counts(config)


def _edited(tiny_checkpoints, tmp_path, family, **changes):
    folder = tmp_path / family
    shutil.copytree(tiny_checkpoints[family], folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "family, changes, words",
    [
        ("roberta", {"max_position_embeddings": 64}, "max_position_embeddings = 64 (2 reserved + 62 positions)"),
        ("bert", {"max_position_embeddings": 128}, "max_position_embeddings = 128"),
        ("gpt2", {"n_positions": 32}, "n_positions = 32"),
        ("bert", {"vocab_size": 120}, "vocab_size = 120"),
    ],
)
@pytest.mark.parametrize("command", ["toeplitz", "fhat"])
def test_config_disagreeing_with_weights_is_refused(tiny_checkpoints, tmp_path, family, changes, words, command,
                                                    capsys):  # fmt: skip
    """Reviewer defect: a config.json from another checkpoint than the weights was analysed silently."""
    folder = _edited(tiny_checkpoints, tmp_path, family, **changes)
    if command == "toeplitz" and "vocab_size" in changes:
        pytest.skip("toeplitz reads no word table")
    with pytest.raises(SystemExit) as info:
        main([command, str(folder), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and not (tmp_path / "o").exists()
    assert err.startswith("posprobe: error: config.json of") and words in err
    assert "the folder mixes files from two checkpoints; re-download it" in err and err.count("\n") == 1


def test_docs_family_table_is_the_family_table():
    """The family table moved from the README to the docs' families page (scripts/docs_pages.py writes it)."""
    from pathlib import Path

    from posprobe.architectures.table import families_markdown

    readme = (Path(__file__).resolve().parents[1] / "docs" / "families.md").read_text(encoding="utf-8")
    block = readme.split("<!-- families:begin -->\n", 1)[1].split("\n<!-- families:end -->", 1)[0]
    assert block == families_markdown()


@pytest.mark.parametrize("field, value", [("kind", "rotery"), ("norm", "rms"), ("qkv", "fused"), ("embed_scale", "x")])
def test_a_typo_in_a_family_entry_fails_at_once(field, value):
    from posprobe.architectures.table import Family

    with pytest.raises(ValueError, match=f"{field} '{value}' is not one of"):
        Family("x", ("x",), **({"kind": ROTARY} | {field: value}))
    with pytest.raises(ValueError, match=f"{field} '{value}' is not one of"):  # in the fields a decoder is read with
        Family("x", ("x",), ROTARY, decoder_stack={field: value})


def test_fields_a_hand_written_config_leaves_out_take_the_models_own_defaults():
    """Norm epsilon and Gemma 2's query_pre_attn_scalar: the defaults of the family's transformers config class
    (MPNet 1e-12, DeBERTa-v2 1e-7, Gemma 2 256), not one guess for all."""
    from posprobe.families.context import config_default

    keys = ("layer_norm_eps", "rms_norm_eps")
    assert config_default({"model_type": "mpnet"}, keys) == 1e-12
    assert config_default({"model_type": "deberta-v2"}, keys) == 1e-7
    assert config_default({"model_type": "gemma2"}, ("query_pre_attn_scalar",)) == 256
    assert config_default({"model_type": "no-such-type"}, keys) is None


def test_config_switches_decide_the_kind_and_no_message_points_in_a_circle():
    """A DeBERTa with relative_attention off is not read as disentangled (`fhat` sent users to `toeplitz`,
    `toeplitz` back to `fhat`): its absolute table is its position mechanism, or it has none; Falcon's `alibi` and
    ESM's `position_embedding_type` pick their kinds."""
    from posprobe.architectures.table import ALIBI, OTHER, has_learned_table

    for model_type in ("deberta-v2", "deberta"):
        off = {"model_type": model_type, "relative_attention": False}
        assert position_kind(off)[0] == LEARNED and has_learned_table(off)
        assert position_kind({**off, "position_biased_input": False})[0] == OTHER
        on = {"model_type": model_type, "relative_attention": True}
        assert position_kind(on)[0] == "disentangled" and has_learned_table(on)  # a table beside the mechanism
        assert not has_learned_table({**on, "position_biased_input": False})  # v3
    assert position_kind({"model_type": "falcon", "alibi": True})[0] == ALIBI
    assert position_kind({"model_type": "falcon"})[0] == ROTARY
    assert position_kind({"model_type": "esm", "position_embedding_type": "rotary"})[0] == ROTARY
    assert position_kind({"model_type": "esm"})[0] == LEARNED
    assert not has_learned_table({"model_type": "esm", "position_embedding_type": "rotary"})


def test_the_family_table_is_the_only_place_that_names_model_types():
    """No module outside families/table.py branches on (or spells out) a model type or family name: a family's
    differences are table fields, so adding a family of an existing kind is one entry plus one test config."""
    import re
    from pathlib import Path

    from posprobe.families import FAMILIES

    names = {t for f in FAMILIES for t in f.model_types} | {f.name for f in FAMILIES}
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    quoted = re.compile(r"""["'](""" + alternatives + r""")["']""")
    package = Path(__file__).resolve().parents[1] / "posprobe"
    found = [
        f"{path.relative_to(package)}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0)}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "table.py"
        for text in [path.read_text(encoding="utf-8")]
        for m in quoted.finditer(text)
        if (path.name, m.group(0)) != ("states.py", '"ctrl"')  # the control-task column of `states`, not CTRL
    ]
    assert found == []


def test_what_is_not_read_exactly_is_refused_in_one_line(tmp_path, capsys):
    """A MobileBERT with LayerNorm bottlenecks (not released; posprobe folds only the affine NoNorm ones) is
    refused, saying why, rather than read approximately (a multimodal Gemma 3 is read as its language model now:
    tests/test_multimodal_wrappers.py)."""
    from posprobe.architectures.table import OTHER

    kind, words = position_kind({"model_type": "mobilebert", "normalization_type": "layer_norm"})
    assert kind == OTHER and "'no_norm'" in words
    assert position_kind({"model_type": "mobilebert"})[0] == LEARNED
    for config in ({"model_type": "mobilebert", "normalization_type": "layer_norm"},):
        (tmp_path / "config.json").write_text(json.dumps(config))
        (tmp_path / "model.safetensors").write_bytes(b"")
        with pytest.raises(SystemExit) as info:
            main(["profiles", str(tmp_path), "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1 and "posprobe does not read this model yet" in err
        assert "no_norm" in err


@pytest.mark.slow
def test_the_rotary_modules_that_take_a_layer_type_are_listed():
    """Issue 49: whether a family's rotary module takes a layer type is decided from `ROTARY_PER_LAYER_TYPE`, with no
    import; the list equals what every rotary family's module says in its forward's signature (imports them all)."""
    from posprobe.families.windows import ROTARY_PER_LAYER_TYPE, module_takes_layer_type

    classes = {f.rotary_class for f in FAMILIES if f.kind == ROTARY and f.rotary_class}
    assert {c for c in classes if module_takes_layer_type(c)} == set(ROTARY_PER_LAYER_TYPE)
