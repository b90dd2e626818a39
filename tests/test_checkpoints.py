"""Model access: every family's tensors, reserved rows, sharding, dtypes, and clear errors for bad input."""

import json
import shutil

import numpy as np
import pytest
from conftest import FAMILIES, build_tiny

from posprobe.checkpoint import WeightReader, default_model_dir, resolve_model
from posprobe.errors import PosprobeError
from posprobe.pipelines.weights import fhat as fhat_analysis
from posprobe.pipelines.weights import open_model
from posprobe.pipelines.weights import toeplitz as toeplitz_analysis


def read_position_table(source):
    return open_model(source=source).position_table


def _torch_position_table(model, family):
    if family == "gpt2":
        return model.wpe.weight
    if family == "electra":
        return model.electra.embeddings.position_embeddings.weight
    return model.embeddings.position_embeddings.weight


@pytest.mark.parametrize("family", FAMILIES)
def test_position_table_matches_model(tiny_checkpoints, tiny_models, family):
    table = read_position_table(resolve_model(str(tiny_checkpoints[family])))
    expected = _torch_position_table(tiny_models[family], family).detach().double().numpy()
    dropped = 2 if family in ("roberta", "xlm-roberta") else 0
    assert table.dropped_rows == dropped
    np.testing.assert_array_equal(table.table, expected[dropped:])
    assert table.n_positions == 64


def test_factorised_embeddings_are_projected(tiny_checkpoints):
    for family in ("albert", "electra"):
        ctx = open_model(str(tiny_checkpoints[family]))
        assert ctx.position_table.table.shape == (64, 16)
        assert ctx.projection()[0].shape == (32, 16)
        assert ctx.embedding.shape == (32,)


def test_albert_every_depth_reads_the_shared_layer(tiny_checkpoints):
    ctx = open_model(str(tiny_checkpoints["albert"]))
    a0, a1 = ctx.attention(0), ctx.attention(1)
    assert a1.stored_layer == 0
    np.testing.assert_array_equal(a0.wq, a1.wq)


def test_gpt2_fused_qkv_is_split(tiny_checkpoints, tiny_models):
    ctx = open_model(str(tiny_checkpoints["gpt2"]))
    attn = ctx.attention(1)
    w = tiny_models["gpt2"].h[1].attn.c_attn.weight.detach().double().numpy()  # (d, 3d), x @ W
    wq, _, wk, _ = attn.linear()
    np.testing.assert_array_equal(wq, w[:, :32].T)
    np.testing.assert_array_equal(wk, w[:, 32:64].T)
    np.testing.assert_array_equal(attn.wq[1], w[:, 8:16])  # head 1: q_1 = x @ W[:, 8:16] (head size 8)
    assert ctx.family.pre_norm is not None


def test_sharded_and_bfloat16_checkpoints(tmp_path):
    import torch

    model = build_tiny("bert")
    model.to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="20KB")
    assert list(tmp_path.glob("*.safetensors.index.json"))
    table = read_position_table(resolve_model(str(tmp_path)))
    np.testing.assert_array_equal(table.table, model.embeddings.position_embeddings.weight.detach().float().numpy())


def test_bert_subclass_prefix_is_found(tmp_path):
    import transformers as tf
    from conftest import TINY

    model = tf.BertForSequenceClassification(tf.BertConfig(**TINY))
    model.save_pretrained(tmp_path)
    assert toeplitz_analysis(str(tmp_path)).n_positions == 64
    assert fhat_analysis(str(tmp_path)).matrices.shape == (4, 64, 64)


def test_default_model_is_packaged():
    folder = default_model_dir()
    assert (folder / "model.safetensors").is_file()
    source = resolve_model(None)
    assert source.name == "all-MiniLM-L6-v2" and source.model_type == "bert"


# ----------------------------------------------------------------------------------- bad input
def test_unknown_hub_id_offline_says_what_to_do(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PosprobeError) as err:
        resolve_model("no-such-org/no-such-model-xyz")
    assert "HF_HUB_OFFLINE" in str(err.value) and "local folder" in str(err.value)


def test_missing_folder_and_bad_id():
    with pytest.raises(PosprobeError, match="no folder"):
        resolve_model("./does/not/exist")
    with pytest.raises(PosprobeError, match="not a valid hub model id"):
        resolve_model("bad id with spaces")


def test_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(PosprobeError, match="holds no model weights"):
        resolve_model(str(tmp_path))


def test_folder_without_config(tmp_path):
    with pytest.raises(PosprobeError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_malformed_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(PosprobeError, match="not valid JSON"):
        resolve_model(str(tmp_path))


def test_corrupt_safetensors(tiny_checkpoints, tmp_path):
    shutil.copytree(tiny_checkpoints["bert"], tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(PosprobeError, match="cannot read"):
        toeplitz_analysis(str(tmp_path / "m"))


def test_truncated_tensor_data(tiny_checkpoints, tmp_path):
    shutil.copytree(tiny_checkpoints["bert"], tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 4096])
    with pytest.raises(PosprobeError):
        fhat_analysis(str(tmp_path / "m"))


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy-non-zip"])
def test_pickle_weights_refused_unless_allowed(tiny_models, tmp_path, zip_format):
    """Both torch.save formats read with --allow-pickle (the legacy one failed with torch's mmap message)."""
    import torch

    model = tiny_models["bert"]
    model.config.save_pretrained(tmp_path)
    state = {k: v.float() for k, v in model.state_dict().items()}
    torch.save(state, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=zip_format)
    with pytest.raises(PosprobeError, match="--allow-pickle"):
        resolve_model(str(tmp_path))
    source = resolve_model(str(tmp_path), allow_pickle=True)
    assert source.weight_format == "pickle"
    np.testing.assert_allclose(
        read_position_table(source).table,
        model.embeddings.position_embeddings.weight.detach().double().numpy(),
        rtol=1e-6,
    )


def test_nan_weights_are_reported(tmp_path):
    import torch

    model = build_tiny("bert")
    with torch.no_grad():
        model.embeddings.position_embeddings.weight[3, 2] = float("nan")
    model.save_pretrained(tmp_path)
    with pytest.raises(PosprobeError, match="NaN"):
        toeplitz_analysis(str(tmp_path))


@pytest.mark.parametrize(
    "model_type, words",
    [
        ("t5", "relative position buckets"),
        ("llama", "rotary"),
        ("bloom", "ALiBi"),
        ("whatever-new", "table does not list"),
    ],
)
def test_models_without_learned_positions(tmp_path, model_type, words):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(PosprobeError, match=words):
        toeplitz_analysis(str(tmp_path))


def test_relative_key_bert_is_refused(tmp_path):
    build_tiny("bert", position_embedding_type="relative_key").save_pretrained(tmp_path)
    with pytest.raises(PosprobeError, match="relative_key"):
        toeplitz_analysis(str(tmp_path))


def test_block_larger_than_table(tiny_checkpoints):
    with pytest.raises(PosprobeError, match="block 65"):
        toeplitz_analysis(str(tiny_checkpoints["bert"]), blocks=[65])


def test_layer_out_of_range(tiny_checkpoints):
    with pytest.raises(PosprobeError, match="layers 0..1"):
        fhat_analysis(str(tiny_checkpoints["bert"]), layer=2)


def test_reader_lists_and_finds_suffixes(tiny_checkpoints):
    reader = WeightReader(tiny_checkpoints["electra"])
    assert (
        reader.find_suffix("embeddings.position_embeddings.weight") == "electra.embeddings.position_embeddings.weight"
    )
    assert reader.find_suffix("nothing.like.this") is None


def test_profiles_refuse_missing_layers_even_when_shared(tiny_checkpoints):
    from posprobe.pipelines.weights import profiles as compute_profiles

    with pytest.raises(PosprobeError, match="layer 99"):
        compute_profiles(str(tiny_checkpoints["albert"]), layers=[0, 99])


def test_albert_with_several_layer_groups_is_refused(tmp_path):
    build_tiny("albert", num_hidden_groups=2).save_pretrained(tmp_path)
    with pytest.raises(PosprobeError, match="layer groups"):
        fhat_analysis(str(tmp_path))
