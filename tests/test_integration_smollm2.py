"""Integration: the packaged SmolLM2-135M-Instruct, a real rotary LLM stored as a Q4_1 GGUF file (no network).

posprobe reads the file lazily (header, then the tensors asked for, de-quantised by the gguf package); every check
here compares that with transformers' own loading of the same file (`from_pretrained(..., gguf_file=...)`):
tensors, the content-free scores of SPEC §9 against the real attention modules on the constant sequence, the
`profiles` command (the issue's "done when"), `attention` against eager attention, and the GGUF route against the
same model saved as safetensors. Loading the model with transformers takes ~10 s, so those tests are `slow`.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import posprobe
from posprobe.checkpoint.resolve import SMOLLM2_NAME

pytestmark = pytest.mark.integration
LAYERS = [0, 15, 29]
# every test here loads the model with transformers (~10 s on an idle 2-core machine): the default run leaves them
# to CI's slow tier; the cheap SmolLM2 checks (header, damaged copies, the packaged name) are in test_gguf*.py and
# test_packaged_models.py


@pytest.fixture(scope="module")
def smollm2_model(smollm2_gguf):
    """SmolLM2 as transformers loads it from the GGUF file (causal LM, float32, eager attention); read-only."""
    import transformers

    from posprobe.checkpoint.loading import quiet_libraries

    with quiet_libraries():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, attn_implementation="eager"
        )
    return model.eval()


@pytest.mark.slow
def test_every_tensor_equals_from_pretrained(smollm2_gguf, smollm2_model):
    from posprobe.checkpoint import resolve_model
    from posprobe.checkpoint.weights import open_weights

    reader = open_weights(resolve_model(smollm2_gguf))
    state = smollm2_model.state_dict()
    assert set(state) - set(reader.keys()) == {"lm_head.weight"} and smollm2_model.config.tie_word_embeddings
    for key in reader.keys():
        np.testing.assert_array_equal(reader.get(key), state[key].double().numpy(), err_msg=key)


@pytest.mark.slow
def test_content_free_scores_equal_the_real_attention_modules(smollm2_gguf, smollm2_model):
    """SPEC §9 on a real model: posprobe's scores (read lazily from the GGUF file) equal the pre-softmax scores
    of transformers' own attention modules, hooked, on the constant sequence of the average word embedding with
    every layer fed the embedding-level input (a float64 copy of the model loaded from the same file; its RMSNorm
    and rotary angles still compute in float32, as transformers writes them, hence the tolerance)."""
    from family_models import reference_scores

    from posprobe.checkpoint import resolve_model
    from posprobe.checkpoint.weights import open_weights
    from posprobe.families.context import ModelContext, content_free_scores

    n = 48
    source = resolve_model(smollm2_gguf)
    ctx = ModelContext(source, open_weights(source))
    ours = np.stack([content_free_scores(ctx, layer, n) for layer in LAYERS])
    reference = copy.deepcopy(smollm2_model.model).double()
    recorded = reference_scores(reference, n)
    theirs = recorded.scores
    assert recorded.exact and theirs.shape == (30, 9, n, n)
    np.testing.assert_allclose(ours, theirs[LAYERS], rtol=1e-5, atol=1e-6 * np.abs(theirs).max())
    assert np.std(ours[:, :, -1, :]) > 0.1  # positions really change the scores


@pytest.mark.slow
def test_profiles_command_equals_the_model_loaded_by_transformers(smollm2_gguf, smollm2_model, tmp_path):
    """The issue's 'done when': `posprobe profiles SmolLM2-135M-Instruct.Q4_1.gguf --layers 0,15,29 --positions
    64` equals the same analysis of the model transformers loads from that file, and the packaged name gives the
    same arrays."""
    from typer.testing import CliRunner

    from posprobe.cli import app

    out = tmp_path / "out"
    args = ["profiles", str(smollm2_gguf), "--layers", "0,15,29", "--positions", "64", "--json", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["quantization"] == "Q4_1" and record["layers"] == LAYERS
    arrays = np.load(record["npz"])
    loaded = posprobe.profiles(smollm2_model, layers=LAYERS, positions=64)
    scale = np.abs(loaded.profiles).max()
    np.testing.assert_allclose(arrays["profiles"], loaded.profiles, rtol=1e-6, atol=1e-6 * scale)
    packaged = posprobe.profiles(SMOLLM2_NAME, layers=LAYERS, positions=64)
    np.testing.assert_array_equal(packaged.profiles, arrays["profiles"])
    assert packaged.quantization == "Q4_1" and loaded.quantization is None


@pytest.mark.slow
def test_gguf_route_equals_the_safetensors_route(smollm2_gguf, smollm2_model, tmp_path):
    """The same de-quantised model saved as safetensors (with its tokenizer) gives the same analyses."""
    from gguf_files import save_dequantized

    from posprobe.checkpoint.loading import load_tokenizer
    from posprobe.pipelines.attention import attention_profiles

    folder = save_dequantized(smollm2_model, tmp_path / "smollm2-safetensors")
    load_tokenizer(smollm2_gguf).save_pretrained(folder)
    for analysis in (
        lambda m: posprobe.profiles(m, layers=LAYERS, positions=64).profiles,
        lambda m: posprobe.fhat(m, layer=29, positions=32).matrices,
    ):
        np.testing.assert_array_equal(analysis(smollm2_gguf), analysis(folder))
    texts = ["The capital of France is Paris.", "A small cat sat on the warm mat."]
    gguf_run = attention_profiles(smollm2_gguf, texts, max_length=16)
    st_run = attention_profiles(folder, texts, max_length=16)
    for name in ("score_profiles", "prob_profiles", "pair_counts", "mean_distance"):
        np.testing.assert_allclose(getattr(gguf_run.profiles, name), getattr(st_run.profiles, name), rtol=1e-6)


@pytest.mark.slow
def test_attention_on_the_gguf_equals_eager_attention_by_brute_force(smollm2_gguf, smollm2_model):
    """`attention` on the GGUF file (its tokenizer converted from the file) against the eager model loaded by
    transformers, every pair of every layer and head summed by explicit loops (tests/test_attention.py)."""
    from test_attention import brute_force

    from posprobe.checkpoint.loading import load_tokenizer
    from posprobe.pipelines.attention import attention_profiles

    texts = ["The capital of France is Paris.", "A small cat sat on the warm mat today.", "Hello"]
    n = 12
    tokenizer = load_tokenizer(smollm2_gguf)
    ids = [tokenizer(t, truncation=True, max_length=n)["input_ids"] for t in texts]
    result = attention_profiles(smollm2_gguf, texts, max_length=n, batch_size=2)
    reference = brute_force(smollm2_model.model, "llama", ids, n, causal=True)
    profiles = result.profiles
    assert result.causal and profiles.n_queries[0] == reference["n_queries"] == sum(map(len, ids))
    np.testing.assert_array_equal(profiles.pair_counts[0], reference["pair_counts"])
    for name in ("score_profiles", "prob_profiles", "mean_distance", "mean_scores"):
        np.testing.assert_allclose(getattr(profiles, name), reference[name], rtol=1e-4, atol=1e-4, err_msg=name)
