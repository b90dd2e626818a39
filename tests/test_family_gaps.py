"""Issue 34's gap, visible: every causal-LM and masked-LM model type of the installed transformers is read by the
family table (an analysable entry, with its parity case in tests/family_models.py), refused in one line (no softmax
attention in any layer), or named below with the reason it is not read yet. Adding a family removes its line here;
a new transformers version with new types fails until each is read, refused or listed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from family_models import CASES, case

import posprobe
from posprobe.errors import PosprobeError
from posprobe.families import family_for_type

_MULTIMODAL = "a multimodal config that nests its language model's (text_config): posprobe reads text models"
_SEQ2SEQ = "encoder-decoder (its causal LM is the decoder stack alone): not added yet"
_FUSED_ON_DISK = ("transformers splits the checkpoints' fused Q/K/V projection on load: files and loaded models "
                  "name Q/K differently, and an entry reads one layout")  # fmt: skip
_INDEXED = "sparse attention: an indexer picks each query's top-k keys (indexed_attention layers); no layer kind for it"

# model type -> why posprobe does not read it yet (none of these has an analysable entry)
NOT_YET = {
    # multimodal wrappers: their language models have types of their own
    "dots3_note": _MULTIMODAL,
    "emu3": _MULTIMODAL,
    "fuyu": _MULTIMODAL + " (its language model is Persimmon's)",
    "gemma3": _MULTIMODAL + " (its language model is read as gemma3_text)",
    "gemma3n": _MULTIMODAL,
    "gemma4": _MULTIMODAL,
    "gemma4_unified": _MULTIMODAL,
    "gemma4_unified_assistant": _MULTIMODAL,
    "got_ocr2": _MULTIMODAL,
    "llama4": _MULTIMODAL + " (its language model is read as llama4_text)",
    "mllama": _MULTIMODAL + " (and cross-attention layers to the image)",
    "modernvbert": _MULTIMODAL,
    "moss_transcribe_diarize": _MULTIMODAL + " (audio)",
    "phi4_multimodal": "multimodal: per-modality LoRA adapters on a Phi-3 language model",
    "qwen3_5": _MULTIMODAL,
    "qwen3_5_moe": _MULTIMODAL,
    "qwen4_exp": _MULTIMODAL,
    "ultravbert": _MULTIMODAL,
    "gemma4_assistant": "a draft model for Gemma 4's assisted decoding: no config class of its own to read",
    # encoder-decoders whose causal LM is the decoder stack
    "bigbird_pegasus": _SEQ2SEQ + " (block-sparse encoder)",
    "prophetnet": _SEQ2SEQ + " (n-stream self-attention with relative buckets of its own)",
    "trocr": "an image-to-text decoder (cross-attention to image features): not added yet",
    "whisper": _SEQ2SEQ + " (speech input)",
    "musicgen": "audio decoder over several codebooks (summed codebook embeddings, sinusoidal positions)",
    "musicgen_melody": "audio decoder over several codebooks (summed codebook embeddings, sinusoidal positions)",
    "moshi": "speech-text model: a temporal transformer over audio codebooks plus a depth decoder",
    # fused on disk, split when loaded
    "gte": _FUSED_ON_DISK,
    "nomic_bert": _FUSED_ON_DISK,
    "jina_embeddings_v3": _FUSED_ON_DISK + " (and task LoRA adapters)",
    "sarvam_moe": _FUSED_ON_DISK,
    # attention that needs new score code
    "diffllama": "differential attention: two softmaxes per head, subtracted with a learned lambda",
    "dory": "nGPT-style unit-norm q/k rescaled per channel after RoPE: new score code",
    "doge": "dynamic mask attention: a value-dependent learned bias added to every score",
    "jetmoe": "mixture of attention heads: each token's query projection is routed among experts",
    "gemma3n_text": "per-layer inputs, AltUp and Laurel blocks, key/value sharing across layers: new reading code",
    "gemma4_text": "key/value sharing across layers (kv_sharing_modes) and per-layer inputs: new reading code",
    "gemma4_unified_text": "key/value sharing across layers and per-layer inputs, as Gemma 4: new reading code",
    "granite_swa": "a rope theta per layer (layer_rope_theta; a rotary module per theta): new reading code",
    "granitemoe_swa": "a rope theta per layer (layer_rope_theta; a rotary module per theta): new reading code",
    "laguna": "a head count per layer (num_attention_heads_per_layer): posprobe's shapes take one",
    "mimo_v2_flash": "sliding layers have twice the key heads of global ones, and learned sinks: per-layer shapes",
    "cohere_compass_text": "RoPE passed per layer type by the model's forward (layer-type labels of its rotary "
    "module): not examined yet",
    "beam": "a rotary attention scaling applied to the query by its decoder layer (per layer type): not examined yet",
    "minimax_m3_vl_text": "optional sparse indexer selection of keys per query: not examined yet",
    "convbert": "mixed attention: part of each layer's heads are span-based dynamic convolutions",
    "cpmant": "a segment-aware relative position bucket bias of its own layout",
    "roc_bert": "pronunciation and shape embeddings summed with the words (ids of their own)",
    "blt": "byte latent transformer: byte-level local encoder/decoder layers (self-attention plus cross-attention "
    "to patches) around a global transformer over patches whose bounds an entropy model picks: no one layer order",
    "reformer": "LSH layers bucket queries and keys by content (no fixed pairs to score); local layers attend "
    "within chunks and their neighbour chunks (a logsumexp, no softmax call), over factorised axial position tables",
    # sparse / compressed attention
    "axk2": _INDEXED,
    "deepseek_v32": _INDEXED,
    "glm_moe_dsa": _INDEXED,
    "hy_v4": _INDEXED,
    "dots3_note_text": _INDEXED,
    "qwen4_exp_text": _INDEXED + "; linear-attention layers between them",
    "deepseek_v4": "compressed sparse and heavily compressed attention layers (keys pooled over blocks)",
    # hybrids the table cannot describe yet
    "bailing_hybrid": "hybrid of latent (MLA) and linear-attention layers: the latent reader takes no layer types",
    "kimi_linear": "hybrid of NoPE latent attention and KDA linear-attention layers: not added yet",
    "lara_mini": "hybrid with linear-attention layers and NoPE full-attention layers: not added yet",
    "lfm3": "hybrid of short convolutions with sliding-window and full attention, output gates: not added yet",
    "inkling_text": "hybrid layers with short convolutions on keys and values ('hybrid' layer types)",
    "inkling2_text": "hybrid layers with short convolutions on keys and values ('hybrid' layer types)",
    "inkling2_loop_text": "hybrid layers with short convolutions on keys and values, looped",
    "zamba": "shared attention blocks applied at intervals to [hidden; embeddings], between Mamba layers",
    "zamba2": "shared attention blocks applied at intervals to [hidden; embeddings], between Mamba-2 layers",
}  # fmt: skip


def _lm_types() -> set[str]:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    return set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_MASKED_LM_MAPPING_NAMES)


def _unread(model_type: str) -> bool:
    """Neither read (an analysable entry) nor refused (an entry saying it has no softmax attention)."""
    family = family_for_type(model_type)
    return family is None or (family.softmax_attention and not family.analysable)


def test_every_language_model_type_is_read_refused_or_listed_as_not_yet():
    gap = {t for t in _lm_types() if _unread(t)}
    assert sorted(gap - set(NOT_YET)) == [], "read, refuse or list these model types"
    assert sorted(set(NOT_YET) - gap) == [], "these are read or refused now (or left transformers): drop their line"
    assert all(reason and "\n" not in reason for reason in NOT_YET.values())


def test_every_read_language_model_type_has_its_parity_case():
    """An analysable language-model type is checked against its own module (tests/family_models.py)."""
    tested = {case(name).model_type for name in CASES} | {
        "t5", "mt5", "umt5", "longt5", "mpnet", "deberta-v2", "deberta",  # tests/test_families_bias.py
        "bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert", "gpt2",  # tests/conftest.py checkpoints
        "gpt-sw3",  # test_gpt_sw3_reads_as_gpt2 below
    }  # fmt: skip
    read = {t for t in _lm_types() if (f := family_for_type(t)) is not None and f.analysable}
    assert sorted(read - tested) == []


@pytest.mark.parametrize("model_type", ["fnet", "yoso", "nystromformer", "mra", "perceiver"])
def test_types_without_softmax_attention_are_refused_in_one_line(model_type, tmp_path):
    from safetensors.numpy import save_file

    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 32}))
    save_file({"embeddings.word_embeddings.weight": np.zeros((4, 32), dtype=np.float32)},
              str(tmp_path / "model.safetensors"))  # fmt: skip
    with pytest.raises(PosprobeError) as err:
        posprobe.profiles(str(tmp_path))
    message = str(err.value)
    assert f"({model_type}) has no" in message and "no attention scores" in message and "\n" not in message


@pytest.mark.slow
def test_exaone_reads_its_checkpoint_names_and_the_loaded_ones(tmp_path):
    """EXAONE 3 files name tensors transformer.wte / transformer.h.{l}.attn.attention.q_proj; transformers loads
    them as Llama (model.layers.{l}.self_attn.q_proj): both read to the same scores."""
    import torch
    from family_models import build
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    base = build("exaone")
    torch.manual_seed(1)
    lm = AutoModelForCausalLM.from_config(base.config).double().eval()
    lm.model.load_state_dict(base.state_dict())
    lm.save_pretrained(tmp_path / "lm")
    with safe_open(str(tmp_path / "lm" / "model.safetensors"), "np") as f:
        names = set(f.keys())
    assert {"transformer.wte.weight", "transformer.h.0.attn.attention.q_proj.weight"} <= names
    on_disk = posprobe.fhat(str(tmp_path / "lm"), layer=1, positions=12).matrices
    loaded = posprobe.fhat(base, layer=1, positions=12).matrices
    np.testing.assert_allclose(on_disk, loaded, rtol=1e-9, atol=1e-12)
    assert np.std(loaded) > 0


@pytest.mark.slow
def test_nemotron_h_reads_the_older_config_layout(tmp_path):
    """Nemotron-H configs name their layer kinds as layers_block_type (saved by transformers now; its length is the
    layer count) or as the older hybrid_override_pattern beside num_hidden_layers ('M' Mamba-2, '*' attention, '-'
    MLP, 'E' MoE): both read to the same scores, and the layer with no attention before the attention layer reads
    NaN."""
    from family_models import build

    model = build("nemotron_h")
    model.save_pretrained(tmp_path / "new")
    model.save_pretrained(tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    assert config.pop("layers_block_type") == ["linear_attention", "full_attention", "mlp", "full_attention", "moe"]
    config.update(hybrid_override_pattern="M*-*E", num_hidden_layers=5)
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    new = posprobe.fhat(str(tmp_path / "new"), layer=3, positions=12).matrices
    old = posprobe.fhat(str(tmp_path / "old"), layer=3, positions=12).matrices
    np.testing.assert_array_equal(old, new)
    assert np.std(new) > 0
    for folder in ("new", "old"):  # layer 0 is a Mamba-2 layer: no score (NaN), said so
        mamba = posprobe.fhat(str(tmp_path / folder), layer=0, positions=12)
        assert np.isnan(mamba.matrices).all() and "linear_attention" in str(mamba.layer_kind)


def test_gpt_sw3_reads_as_gpt2(tmp_path):
    """transformers builds GPT-2's config class for 'gpt-sw3' (a name it keeps for GPT-SW3's tokenizer): a config
    that says gpt-sw3 reads to the scores of the same checkpoint saying gpt2 (GPT-2's own parity is checked in
    tests/test_fhat.py and tests/test_capture.py)."""
    import torch
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    config = AutoConfig.for_model("gpt-sw3", vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    model = AutoModel.from_config(config).double().eval()
    for folder in ("gpt2", "sw3"):
        model.save_pretrained(tmp_path / folder)
    saved = json.loads((tmp_path / "sw3" / "config.json").read_text())
    assert saved["model_type"] == "gpt2"
    (tmp_path / "sw3" / "config.json").write_text(json.dumps({**saved, "model_type": "gpt-sw3"}))
    for mode in ("paper", "faithful"):
        sw3 = posprobe.fhat(str(tmp_path / "sw3"), layer=1, positions=10, mode=mode)
        gpt2 = posprobe.fhat(str(tmp_path / "gpt2"), layer=1, positions=10, mode=mode)
        assert sw3.model_type == "gpt-sw3" and gpt2.model_type == "gpt2"
        np.testing.assert_array_equal(sw3.matrices, gpt2.matrices)
        assert np.std(sw3.matrices) > 0


def test_pre_norm_flaubert_is_refused_in_one_line(tmp_path):
    """FlauBERT's pre_norm layers: transformers' own module fails on them (no reference to check), so such a
    config is refused, saying why; the post-norm one (its parity case) reads."""
    from family_models import build

    build("flaubert").save_pretrained(tmp_path)
    assert np.std(posprobe.fhat(str(tmp_path), layer=1, positions=10).matrices) > 0
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "pre_norm": True}))
    with pytest.raises(PosprobeError) as err:
        posprobe.fhat(str(tmp_path), layer=1, positions=10)
    assert "pre_norm" in str(err.value) and "\n" not in str(err.value)
