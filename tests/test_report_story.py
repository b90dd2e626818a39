"""The report's opening sentences (`posprobe.report.story`): generated from the sections' records and their
references, one claim per section that ran, each naming its section. Known answers on records shaped like
SmolLM2-135M's (README: no position table, rotary bands, sinks from layer 2 on, loss flat after t ≈ 100, the needle
found except at depth 1), and the opposite readings on records that say the opposite."""

from __future__ import annotations

from posprobe.report.sections import ModelFacts, loss_plateau
from posprobe.report.story import story

FACTS = ModelFacts("SmolLM2", "llama", "rotary", "rotary embeddings (RoPE)", True, False, 30, 8192)


def records(sinks=(0.0, 0.2, 0.9, 1.0, 0.97), probe=(0.21, 0.42, 0.74, 0.89), baseline=0.141, needle=(1, 1, 0)):
    return {
        "rotary": {"context": 128, "summary": [{"q_long_band_share": 0.9, "long_band_fraction": 0.844}] * 3},
        "attention": {"layers": [0, 1, 2, 3, 4], "sink_rate": list(sinks), "uniform_first_token_mass": [0.071] * 5},
        "states": {"probe_r2": list(probe), "probe_r2_baseline": baseline, "baseline_inputs": ["first_token"]},
        "context": {
            "variants": ["none"],
            "lengths": [256, 512],
            "loss_by_octave": {
                "position_bins": [[0, 1], [1, 2], [2, 4], [4, 8], [8, 16], [16, 32], [32, 64], [64, 128], [128, 256],
                                  [256, 511]],  # fmt: skip
                "none": [9.3, 5.0, 3.5, 2.7, 2.3, 2.1, 1.7, 1.48, 1.55, 1.8],
            },
        },
        "needle": {"depths": [0, 0.5, 1], "overall_accuracy": 2 / 3,
                   "grid": [{"length": 256, "accuracy": list(needle)}, {"length": 512, "accuracy": list(needle)}]},
    }  # fmt: skip


def test_smollm2_shaped_records_tell_its_story():
    statuses = {"toeplitz": "not applicable", "rotary": "ok", "attention": "ok", "states": "ok", "context": "ok"}
    claims = story(FACTS, records(), statuses)
    assert [c.section for c in claims] == ["toeplitz", "rotary", "attention", "states", "context", "needle"]
    text = {c.section: c.text for c in claims}
    assert text["toeplitz"].startswith("No position table")
    assert "90% of the query norm" in text["rotary"] and "more than the 84%" in text["rotary"]
    assert text["attention"].startswith("Attention sinks from layer 2 on") and "0.071" in text["attention"]
    assert text["states"].startswith("Position is readable from the hidden states above the no-hidden-state baseline")
    assert "0.890 (hidden state 3) against 0.141 from the first-token flag alone" in text["states"]
    assert "the embedding output (0.210) is not above it" not in text["states"]  # 0.21 > 0.141: it is above
    assert "stops falling by t ≈ 64" in text["context"] and "9.3 nats" in text["context"]
    assert text["needle"].startswith("The needle is found except at depth 1 with this prompt format")


def test_the_opposite_records_give_the_opposite_claims():
    claims = story(
        FACTS,
        records(sinks=(0.9, 0.9, 0.1), probe=(0.05, 0.1), baseline=0.4, needle=(1, 1, 1)),
        {"toeplitz": "ok"},
    )
    text = {c.section: c.text for c in claims}
    assert "toeplitz" not in text  # no record and not 'not applicable': nothing to say
    assert text["attention"].startswith("No attention sinks in the last layer read")
    assert text["states"].startswith("Position is not readable") and "at most 0.100 against 0.400" in text["states"]
    assert text["needle"].startswith("The needle is found at every depth")
    everywhere = story(FACTS, records(sinks=(0.6, 0.7)), {})
    assert next(c.text for c in everywhere if c.section == "attention").startswith("Attention sinks in every layer")


def test_loss_plateau_is_the_first_bin_no_later_bin_falls_below():
    record = records()["context"]
    assert loss_plateau(record) == 64  # 1.48; later 1.55, 1.8: none more than 0.1 below
    record["loss_by_octave"]["none"][-1] = 1.3  # a fall of 0.18 after it: the plateau moves to the last bin
    assert loss_plateau(record) == 256
    assert loss_plateau({"variants": ["none"], "loss_by_octave": {}}) is None


def test_the_needle_claim_names_its_prompt_format():
    for chat, words in ((True, "(the tokenizer's chat template)"), (False, "(plain continuation)")):
        given = records()
        given["needle"]["task"] = {"chat": chat}
        claims = {c.section: c.text for c in story(FACTS, given, {"needle": "ok"})}
        assert claims["needle"].startswith(f"The needle is found except at depth 1 with this prompt format {words}")
