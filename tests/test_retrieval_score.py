"""Wu et al. 2024's retrieval score in `posprobe needle` (issue 46), against brute force: a plain transformers
eager run with `output_attentions` on a tiny random Llama, greedy decoding one token at a time (no cache), each
head's most-attended key at each step, scored by hand. Nothing here calls posprobe's scoring code."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from test_needle import HAYSTACK, planted_llama

from posprobe.analysis.needle import retrieval_hits
from posprobe.pipelines.needle import NeedleGrid, needle
from posprobe.pipelines.needle_prompts import NeedleTask

TASK = NeedleTask(intro="Find the key.\n", needle=" The key is {answer}.", question="\nThe key is")


def copying_llama():
    """The planted Llama of test_needle (heads 0.2 and 1.1 attend to digits) made a bigram model that writes
    " 7777...": every attention and MLP output is zeroed (the residual stream is the token's embedding), and the
    logits are planted on three embedding channels: after 's' comes ' ', after ' ' or a digit comes '7'. Every digit
    has the same embedding, so the planted heads' scores tie over the digits and their argmax is the first one."""
    model, tokenizer = planted_llama()
    ids = {c: tokenizer.convert_tokens_to_ids(c) for c in "s 7"}
    digits = tokenizer.convert_tokens_to_ids(list("0123456789"))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        embed[:, 2:5] = 0.0
        embed[digits, 2:] = 0.0
        embed[digits, 4] = 1.0
        for channel, char in enumerate("s ", start=2):
            embed[ids[char], channel] = 1.0
        model.model.norm.weight.fill_(1.0)
        head = model.lm_head.weight
        head.zero_()
        head[ids[" "], 2] = 10.0
        head[ids["7"], 3] = head[ids["7"], 4] = 10.0
    return model, tokenizer


def brute_force_scores(model, prompt_ids, answer_ids, span) -> np.ndarray:
    """(L, H): greedy decoding for len(answer) steps with eager attention; a head scores at a step when the
    argmax of its attention row is a needle position holding the token generated; the count over len(answer)."""
    model.set_attn_implementation("eager")
    ids = list(prompt_ids)
    counts = None
    with torch.no_grad():
        for _ in range(len(answer_ids)):
            out = model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
            new = int(out.logits[0, -1].argmax())
            layers = []
            for attn in out.attentions:  # (1, H, m, m)
                top = attn[0, :, -1].argmax(-1).tolist()
                layers.append([float(span[0] <= k < span[1] and ids[k] == new) for k in top])
            counts = np.array(layers) if counts is None else counts + np.array(layers)
            ids.append(new)
            if new == 1:  # end of text
                break
    return counts / len(answer_ids)


@pytest.mark.slow  # the model run at every depth and length, brute force
@pytest.mark.parametrize("answer", ["7777", "7787"], ids=["greedy-is-the-answer", "greedy-departs"])
def test_retrieval_score_equals_brute_force(answer):
    """'7777': greedy decoding gives the answer (read from the teacher-forced pass); '7787': it departs at the
    third digit (read from the decoding steps)."""
    model, tokenizer = copying_llama()
    task = replace(TASK, answer=answer)
    grid = NeedleGrid(lengths=(90, 140), depths=(0.0, 0.5, 1.0), trials=2, seed=1)
    result = needle(model, tokenizer=tokenizer, haystack=HAYSTACK, grid=grid, task=task)
    assert result.exact.all() == (answer == "7777") and not (answer != "7777" and result.exact.any())
    assert result.retrieval_score.shape == (2, 3, 2, 2, 4)
    expected = []
    for record in result.records:
        expected.append(brute_force_scores(model, record["prompt_ids"], record["answer_ids"], record["needle_span"]))
    expected = np.array(expected).reshape(result.retrieval_score.shape)
    np.testing.assert_allclose(result.retrieval_score, expected, atol=1e-12)
    assert expected.sum() > 0  # some head copies from the needle at some step: the comparison is not vacuous
    np.testing.assert_allclose(result.head_retrieval, expected.reshape(-1, 2, 4).mean(0), atol=1e-12)
    record = result.to_dict()
    assert [(h["layer"], h["head"]) for h in record["retrieval_heads"]][:1] == [
        tuple(int(x) for x in np.unravel_index(np.argmax(expected.reshape(-1, 2, 4).mean(0)), (2, 4)))
    ]
    assert "needle_attending_heads" in record and "top_heads" not in record


def test_retrieval_hits_by_hand():
    """A 1-layer, 3-head case: keys 0..5 hold tokens [7, 8, 9, 8, 5, 6], the needle is keys 1..3, two steps
    generate 8 then 9."""
    key_ids = [7, 8, 9, 8, 5, 6]
    top = np.array([[[1, 2], [3, 0], [4, -0]]])  # head 0: 8 at 1 (hit), 9 at 2 (hit); head 1: 8 at 3 (hit), 7 at 0
    hits = retrieval_hits(top, key_ids, (1, 4), [8, 9])
    np.testing.assert_array_equal(hits, [[2.0, 1.0, 0.0]])
    absent = retrieval_hits(np.array([[[-1, -1]]]), key_ids, (1, 4), [8, 9])
    assert np.isnan(absent).all()
