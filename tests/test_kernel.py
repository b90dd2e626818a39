"""The attention kernel and its taps (issue 45): with no edit each route gives the model's own outputs; the named
sites see the layers they address (module.layer_idx); edits at the sites equal independent references (a head
zeroed = its output-projection columns zeroed, a key masked at the scores = that key given as padding); taps reach
layers whose family drops a forward's extra keywords (Nemotron)."""

from __future__ import annotations

import pytest
import torch

from posprobe.kernel import BLOCKS, EAGER, SDPA, Taps, register


def tiny_llama(**overrides):
    import transformers as tf

    torch.manual_seed(0)
    sizes = dict(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4)
    config = tf.LlamaConfig(**sizes, num_key_value_heads=2, max_position_embeddings=64, **overrides)
    return tf.LlamaForCausalLM(config).to(torch.float64).eval()


IDS = torch.randint(3, 90, (2, 12), generator=torch.Generator().manual_seed(1))


def own(model, route: str, **inputs):
    """The model's own logits with the attention the route reproduces (sdpa for SDPA, else eager)."""
    model.set_attn_implementation("sdpa" if route == SDPA else "eager")
    with torch.no_grad():
        return model(**{"input_ids": IDS, **inputs}).logits


def run(model, route: str, taps: Taps | None = None, **inputs):
    register()
    model.set_attn_implementation(route)
    try:
        with torch.no_grad():
            inputs = {"input_ids": IDS, **inputs}
            return (model(**inputs) if taps is None else taps.forward(model, **inputs)).logits
    finally:
        model.set_attn_implementation("eager")


@pytest.mark.parametrize("route", [EAGER, SDPA, BLOCKS])
def test_every_route_without_edits_gives_the_models_own_outputs(route):
    model = tiny_llama()
    eager = own(model, route)
    torch.testing.assert_close(run(model, route, Taps(block_rows=5)), eager, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(run(model, route), eager, rtol=1e-10, atol=1e-10)


def test_sites_are_addressed_by_layer_idx_and_see_their_shapes():
    model = tiny_llama()
    seen = []
    taps = Taps()
    for site in ("query", "key", "scores", "pattern", "head_output"):
        taps.on(site, lambda x, call, site=site: seen.append((site, call.layer, tuple(x.shape))), layers=[1])
    run(model, EAGER, taps)
    assert seen == [
        ("query", 1, (2, 4, 12, 8)),
        ("key", 1, (2, 2, 12, 8)),
        ("scores", 1, (2, 4, 12, 12)),
        ("pattern", 1, (2, 4, 12, 12)),
        ("head_output", 1, (2, 12, 4, 8)),
    ]
    with pytest.raises(ValueError, match="no site"):
        Taps().on("logits", print)


@pytest.mark.parametrize("route", [EAGER, SDPA, BLOCKS])
def test_a_zeroed_head_equals_its_output_projection_columns_zeroed(route):
    model = tiny_llama()
    layer, head, d_h = 2, 3, 8

    def zero(out, call):
        out = out.clone()
        out[:, :, head] = 0
        return out

    edited = run(model, route, Taps(block_rows=5).on("head_output", zero, layers=[layer]))
    with torch.no_grad():
        model.model.layers[layer].self_attn.o_proj.weight[:, head * d_h : (head + 1) * d_h] = 0
    reference = own(model, route)
    torch.testing.assert_close(edited, reference, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(edited, run(tiny_llama(), route))


@pytest.mark.parametrize("route", [EAGER, SDPA, BLOCKS])
def test_a_key_masked_at_the_scores_equals_that_key_given_as_padding(route):
    model = tiny_llama()
    key = 4

    def mask(scores, call):
        return scores.index_fill(-1, torch.tensor([key]), torch.finfo(scores.dtype).min)

    edited = run(model, route, Taps(block_rows=5).on("scores", mask))
    padding = torch.ones_like(IDS)
    padding[:, key] = 0
    reference = own(model, EAGER, attention_mask=padding)
    torch.testing.assert_close(edited, reference, rtol=1e-10, atol=1e-10)


def test_taps_reach_the_layers_of_a_family_that_drops_extra_keywords():
    import transformers as tf

    torch.manual_seed(0)
    config = tf.NemotronConfig(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)  # fmt: skip
    model = tf.NemotronForCausalLM(config).eval()
    layers = []
    run(model, EAGER, Taps().on("pattern", lambda x, call: layers.append(call.layer)))
    assert layers == [0, 1]


def test_the_row_site_is_the_patterns_row():
    model = tiny_llama()
    rows, patterns = [], []
    run(model, SDPA, Taps(row=7).on("row", lambda x, call: rows.append(x)))
    run(model, EAGER, Taps().on("pattern", lambda x, call: patterns.append(x[:, :, 7])))
    assert len(rows) == len(patterns) == 3
    for row, pattern in zip(rows, patterns, strict=True):
        torch.testing.assert_close(row.double(), pattern, rtol=1e-5, atol=1e-6)


def test_text_analyses_read_the_edited_attention():
    """attention_profiles with a key masked by an edit: the masked key gets no attention in the recorded
    probabilities, and without edits the records equal a run with no edits argument (the same numbers)."""
    import numpy as np

    from posprobe.pipelines.attention import attention_profiles

    model = tiny_llama().float()
    texts = [list(range(3, 15)), list(range(20, 30))]

    def first_key_cut(scores, call):
        return scores.index_fill(-1, torch.tensor([0]), torch.finfo(scores.dtype).min)

    plain = attention_profiles(model, input_ids=texts, max_length=12, weights_correlation=False)
    same = attention_profiles(model, input_ids=texts, max_length=12, weights_correlation=False, taps=Taps())
    cut = attention_profiles(model, input_ids=texts, max_length=12, weights_correlation=False,
                             taps=Taps().on("scores", first_key_cut, layers=[1]))  # fmt: skip
    np.testing.assert_array_equal(same.sinks.first_token_mass, plain.sinks.first_token_mass)
    assert (plain.sinks.first_token_mass > 0.01).all()
    assert np.abs(cut.sinks.first_token_mass[1]).max() < 1e-6 and (cut.sinks.first_token_mass[0] > 0.01).all()


def test_needle_reads_retrieval_after_the_edits():
    """needle with no edit (empty taps) equals needle without edits; with the needle's keys cut from every query in
    every layer, the retrieval attention on the needle is zero and the answer's log-probability changes."""
    import numpy as np
    from test_needle import HAYSTACK, TASK, planted_llama

    from posprobe.pipelines.needle import NeedleGrid, needle

    model, tokenizer = planted_llama()
    grid = NeedleGrid(lengths=(120,), depths=(0.5,), trials=1, seed=3)
    run = lambda taps: needle(model, tokenizer=tokenizer, haystack=HAYSTACK, grid=grid, task=TASK, taps=taps)  # noqa: E731
    plain, same = run(None), run(Taps())
    span = plain.records[0]["needle_span"]

    def cut(scores, call):
        return scores.index_fill(-1, torch.arange(*span), torch.finfo(scores.dtype).min)

    edited = run(Taps().on("scores", cut))
    np.testing.assert_array_equal(same.needle_attention, plain.needle_attention)
    np.testing.assert_array_equal(same.log_prob, plain.log_prob)
    assert plain.needle_attention.max() > 0.1 and np.abs(edited.needle_attention).max() < 1e-6
    assert not np.allclose(edited.log_prob, plain.log_prob)
