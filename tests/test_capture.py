"""The capture layer (`posprobe.capture`): what reducers see equals what transformers computes on each text alone
(hidden states from `output_hidden_states`, scores recomputed by hand from the layer inputs, probabilities from
eager `output_attentions`), the masks are right under padding, every batch reaches every reducer once, and the
model is left as it was, also when the run fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_attention import CLS, SEP, reference_scores, sequences, tiny_model

from posprobe.capture import BatchCapture, capture, capture_batches, id_tokenizer, pad_batch, token_batches
from posprobe.errors import PosprobeError

FAMILIES = ["bert", "gpt2", "llama"]
CAUSAL = {"bert": False, "gpt2": True, "llama": True}


class Keep:
    """A reducer that keeps, per text, what the capture handed over for its real tokens (on the CPU)."""

    def __init__(self, needs=("scores", "probs", "hidden_states")):
        self.needs = needs
        self.texts: dict[int, dict] = {}
        self.batches: list[int] = []

    def add(self, batch: BatchCapture) -> None:
        self.batches.append(batch.index)
        for row, text in enumerate(batch.text_ids.tolist()):
            n = int(batch.real[row].sum())
            keep = {"ids": batch.input_ids[row, :n].tolist(), "positions": batch.positions[row].tolist()}
            keep["special"] = batch.special[row, :n].tolist()
            keep["counted"] = batch.counted[row].tolist()
            if batch.hidden_states is not None:
                keep["hidden"] = [h[row, :n].double().numpy() for h in batch.hidden_states]
            if batch.scores is not None:
                keep["scores"] = np.stack([s[row, :, :n, :n].double().numpy() for s in batch.scores])
            if batch.probs is not None:
                keep["probs"] = np.stack([a[row, :, :n, :n].double().numpy() for a in batch.probs])
                keep["pairs"] = np.stack([p[row].numpy() for p in batch.counted_pairs])
            assert text not in self.texts
            self.texts[text] = keep

    def result(self):
        return self.texts


@pytest.mark.parametrize("family", FAMILIES)
def test_reducers_see_each_text_as_transformers_computes_it_alone(family):
    """Hidden states equal `output_hidden_states`, S the pre-softmax scores recomputed by hand from each layer's
    input, A eager `output_attentions` — each text run alone, unpadded; the capture ran them padded together."""
    model = tiny_model(family)
    texts = sequences(7, seed=2)
    keep = Keep()
    summary = capture(model, [keep], input_ids=texts, special_ids=[CLS, SEP], max_length=16, batch_size=3)
    assert summary.n_texts == 7 and summary.n_batches == 3 and summary.n_layers == 2 and summary.n_heads == 4
    assert sorted(keep.texts) == list(range(7)) and keep.batches == [0, 1, 2]
    for index, ids in enumerate(texts):
        got = keep.texts[index]
        assert got["ids"] == ids
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        assert len(got["hidden"]) == len(alone.hidden_states) == 3  # embedding output, then one per layer
        for ours, theirs in zip(got["hidden"], alone.hidden_states):
            np.testing.assert_allclose(ours, theirs[0].double().numpy(), rtol=1e-5, atol=1e-5)
        S, A = reference_scores(model, family, ids)  # (L, H, n, n), S by hand (no mask), A eager
        allowed = np.tril(np.ones((len(ids),) * 2, bool)) if CAUSAL[family] else np.ones((len(ids),) * 2, bool)
        np.testing.assert_allclose(got["scores"][:, :, allowed], S[:, :, allowed], rtol=1e-5, atol=1e-5)
        assert (got["scores"][:, :, ~allowed] < -1e30).all()  # the causal mask is part of S
        np.testing.assert_allclose(got["probs"], A, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_states_only_leave_the_models_attention_alone(family):
    """Without scores or probabilities nothing is recorded: hidden states are exactly the padded batch's
    `output_hidden_states` with the model's own attention."""
    model = tiny_model(family)
    texts = sequences(4, seed=4)
    keep = Keep(needs=("hidden_states",))
    capture(model, [keep], input_ids=texts, max_length=16, batch_size=4)
    batch = next(token_batches(texts, id_tokenizer((), 16), batch_size=4, pad_id=0))
    with torch.no_grad():
        direct = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
    for row, text in enumerate(batch.text_ids.tolist()):
        n = len(texts[text])
        for ours, theirs in zip(keep.texts[text]["hidden"], direct.hidden_states):
            np.testing.assert_array_equal(ours, theirs[row, :n].double().numpy())
        assert "scores" not in keep.texts[text]


def test_hidden_states_of_a_model_whose_attention_cannot_be_recorded():
    """Longformer attends in sliding chunks (no (queries x keys) matrix): refused for attention, not for hidden
    states."""
    import transformers as tf

    config = tf.LongformerConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=37, max_position_embeddings=66, attention_window=4)  # fmt: skip
    model = tf.LongformerModel(config).eval()
    keep = Keep(needs=("hidden_states",))
    capture(model, [keep], input_ids=sequences(3), max_length=16)
    assert len(keep.texts) == 3 and len(keep.texts[0]["hidden"]) == 3
    with pytest.raises(PosprobeError, match="not one softmax over all keys"):
        capture(model, [Keep(needs=("probs",))], input_ids=sequences(3), max_length=16)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_masks_under_padding(family):
    model = tiny_model(family)
    texts = [[CLS, 7, 8, 9, SEP], [CLS, 7, SEP], [CLS, SEP]]
    seen = []

    class Masks:
        needs = ("probs",)

        def add(self, batch):
            seen.append(batch)

        def result(self):
            return None

    capture(model, [Masks()], input_ids=texts, special_ids=[CLS, SEP], exclude_special=True, max_length=16)
    (batch,) = seen
    assert batch.text_ids.tolist() == [0, 1, 2]  # longest first
    real = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    special = torch.tensor([[1, 0, 0, 0, 1], [1, 0, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(batch.real, real) and torch.equal(batch.special, special)
    assert torch.equal(batch.counted, real & ~special)
    assert batch.positions.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, -1, -1], [0, 1, -1, -1, -1]]
    for layer in range(2):
        allowed = batch.allowed[layer]
        for b in range(3):
            expected = real[b][None, :].expand(5, 5).clone()  # every query sees the real keys...
            if CAUSAL[family]:
                expected &= torch.ones(5, 5, dtype=torch.bool).tril()  # ...up to itself
            rows = real[b]  # padded query rows are never used; compare the real ones
            assert torch.equal(allowed[b][rows], expected[rows])
        pairs = batch.counted_pairs[layer]
        counted = batch.counted
        assert torch.equal(pairs, allowed & counted[:, :, None] & counted[:, None, :])
        assert not pairs[:, :, 0].any() and not pairs[2].any()  # [CLS] never counted; text 2 holds only specials
        assert torch.all(batch.probs[layer][~batch.real[:, None, None, :].expand_as(batch.probs[layer])] == 0)


def test_every_reducer_sees_every_batch_once_in_length_sorted_chunks():
    model = tiny_model("bert")
    rng = np.random.default_rng(0)
    texts = [[5] * int(rng.integers(1, 12)) for _ in range(40)]
    a, b = Keep(needs=()), Keep(needs=("probs",))
    progress = []
    summary = capture(model, [a, b], input_ids=texts, max_length=16, batch_size=2, progress=progress.append)
    assert summary.n_batches == 20 and summary.longest == 11 and sum(progress) == 40
    for reducer in (a, b):
        assert reducer.batches == list(range(20)) and sorted(reducer.texts) == list(range(40))
    # batches come in chunks of 16 batches (32 texts), each sorted longest first
    lengths = [len(a.texts[t]["ids"]) for t in range(40)]
    order = list(a.texts)  # insertion order = batch order
    chunk = [lengths[t] for t in order[:32]]
    assert chunk == sorted(chunk, reverse=True) and sorted(order[:32]) == list(range(32))
    limited = Keep(needs=())
    assert capture(model, [limited], input_ids=texts, max_length=16, max_texts=5).n_texts == 5
    assert sorted(limited.texts) == list(range(5))


@pytest.mark.parametrize("stop", [PosprobeError("stop", "hint"), KeyboardInterrupt()])
def test_the_model_is_restored_when_a_run_fails(stop):
    model = tiny_model("gpt2").train()
    model.set_attn_implementation("sdpa")

    class Failing:
        needs = ("scores",)

        def add(self, batch):
            if batch.index == 1:
                raise stop

        def result(self):
            return None

    with pytest.raises(type(stop)):
        capture(model, [Failing()], input_ids=sequences(6), max_length=16, batch_size=2)
    assert model.training and model.config._attn_implementation == "sdpa"


def test_training_mode_is_switched_off_during_the_run():
    model = tiny_model("bert").train()
    model.config.attention_probs_dropout_prob = model.config.hidden_dropout_prob = 0.5
    runs = [Keep(needs=("probs",)) for _ in range(2)]
    for keep in runs:
        capture(model, [keep], input_ids=sequences(3), max_length=16, verify=False)
    np.testing.assert_array_equal(runs[0].texts[0]["probs"], runs[1].texts[0]["probs"])  # no dropout
    assert model.training


def test_capture_batches_and_bad_arguments():
    model = tiny_model("bert")
    batch = pad_batch([(0, [CLS, 5, SEP], [1, 0, 1])], pad_id=0, exclude_special=False)
    keep = Keep(needs=("probs",))
    assert capture_batches(model, [batch], [keep]).n_texts == 1
    with pytest.raises(PosprobeError, match="no texts"):
        capture_batches(model, [], [keep])
    with pytest.raises(PosprobeError, match="exactly one of texts and input_ids"):
        capture(model, [keep], max_length=8)
    with pytest.raises(PosprobeError, match="tokenizer"):
        capture(model, [keep], ["a text"], max_length=8)
    with pytest.raises(ValueError, match="attentions"):
        capture(model, [Keep(needs=("attentions",))], input_ids=[[1]], max_length=8)


def test_a_model_with_a_head_is_captured_and_checked_on_its_logits():
    """A causal LM (as GGUF checkpoints load): the eager check compares logits; hidden states are the base's."""
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    model = tf.LlamaForCausalLM(config).eval()
    keep = Keep()
    capture(model, [keep], input_ids=sequences(3), max_length=16)
    ids = sequences(3)[0]
    with torch.no_grad():
        alone = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    for ours, theirs in zip(keep.texts[0]["hidden"], alone.hidden_states):
        np.testing.assert_allclose(ours, theirs[0].double().numpy(), rtol=1e-5, atol=1e-5)
