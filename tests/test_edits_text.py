"""Edits (SPEC §20) on the text runs — `attention`, `states` — with padded batches: known answers (a window of one
key puts all attention at k = 0, on whole matrices and in blocks; a channel set to 0 or to its mean has no
positional vector), the mean over real tokens equal to a plain reference, and the edits recorded."""

from __future__ import annotations

import numpy as np
import torch
from test_edits import _sharpen, hooked

import posprobe


def tiny_base():
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=37, vocab_size=99, max_position_embeddings=64)  # fmt: skip
    return _sharpen(tf.LlamaModel(config).eval())


def texts(count: int = 6, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(5, 99, size=rng.integers(6, 14))] for _ in range(count)]


def test_attention_with_a_window_of_one_key_attends_to_itself_on_both_routes():
    model, ids = tiny_base(), texts()
    for block_size in (0, 4):
        result = posprobe.attention_profiles(model, input_ids=ids, max_length=16, batch_size=3, edits=["attend:0,1"],
                                             weights_correlation=False, block_size=block_size)  # fmt: skip
        zero = list(result.profiles.offsets).index(0)
        np.testing.assert_allclose(result.profiles.prob_profiles[..., zero], 1.0, atol=1e-6)
        np.testing.assert_allclose(result.profiles.mean_distance, 0.0, atol=1e-6)
        assert result.edits == ["attend:0,1"] and result.metadata()["edits"] == ["attend:0,1"]
    plain = posprobe.attention_profiles(model, input_ids=ids, max_length=16, batch_size=3, weights_correlation=False)
    assert plain.profiles.mean_distance.min() > 0.1 and plain.edits == []


def test_states_channel_edits_and_the_mean_over_real_tokens():
    """channel:0.5 (zero) and channel:0.7=mean leave those channels of hidden state 1 (block 0's output) constant:
    no positional vector there; the mean is over real tokens only (padded batches), as a plain reference over each
    text alone gives it. (The last hidden state is after the final norm, so its channels are not the block's.)"""
    model, ids = tiny_base(), texts()
    result = posprobe.states(model, input_ids=ids, max_length=16, batch_size=3, min_texts=2, controls=1,
                             edits=["channel:0.5", "channel:0.7=mean"])  # fmt: skip
    vectors = result.vectors.vectors
    kept = result.vectors.kept
    np.testing.assert_allclose(vectors[1][kept][:, 5], 0.0, atol=1e-6)
    np.testing.assert_allclose(vectors[1][kept][:, 7], 0.0, atol=1e-6)
    assert np.abs(vectors[1][kept][:, 6]).max() > 1e-3
    assert result.edits == ["channel:0.5", "channel:0.7=mean"]

    from posprobe.edits import parse_edits
    from posprobe.edits.apply import MeanPass

    seen = []
    with hooked((model.layers[0], lambda m, a, out: seen.append((out[0] if isinstance(out, tuple) else out)[0]),
                 False)), torch.no_grad():  # fmt: skip
        for text in ids:
            model(input_ids=torch.tensor([text]))
    reference = torch.cat(seen).double().mean(0)[7]
    padded = torch.zeros(len(ids), 14, dtype=torch.long)
    real = torch.zeros(len(ids), 14, dtype=torch.bool)
    for k, text in enumerate(ids):
        padded[k, : len(text)], real[k, : len(text)] = torch.tensor(text), True
    with MeanPass(model, parse_edits(["channel:0.7=mean"])) as collect, torch.no_grad():
        collect.real = real
        model(input_ids=padded, attention_mask=real.long())
    assert abs(float(collect.means()[("channel", 0)][7]) - float(reference)) < 1e-5


def test_profiles_and_rotary_on_texts_take_edits():
    """Data-conditioned profiles: a channel edit on block 0's output changes layer 1's input (its profiles move)
    and not layer 0's (the embeddings); rotary --text's band norms likewise; the edits are recorded."""
    model, ids = tiny_base(), texts(count=20)
    kwargs = dict(input_ids=ids, max_length=16, batch_size=4, min_texts=2, positions=8)
    plain = posprobe.profiles(model, [0, 1], **kwargs)
    edited = posprobe.profiles(model, [0, 1], edits=["channel:0.3,4,5,6"], **kwargs)
    assert edited.conditioning["edits"] == ["channel:0.3,4,5,6"] and plain.conditioning["edits"] == []
    np.testing.assert_allclose(edited.profiles[0], plain.profiles[0], atol=1e-10, equal_nan=True)
    assert np.nanmax(np.abs(edited.profiles[1] - plain.profiles[1])) > 1e-4
    bands = posprobe.rotary(model, [0, 1], input_ids=ids, max_length=16, edits=["channel:0.3,4,5,6"])
    plain_bands = posprobe.rotary(model, [0, 1], input_ids=ids, max_length=16)
    assert bands.texts["edits"] == ["channel:0.3,4,5,6"]
    np.testing.assert_allclose(bands.q_band_norm[0], plain_bands.q_band_norm[0], atol=1e-10)
    assert np.abs(bands.q_band_norm[1] - plain_bands.q_band_norm[1]).max() > 1e-4
