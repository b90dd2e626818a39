"""`posprobe report` loads its model once (`posprobe.checkpoint.shared`): every section's record equals the record
of its command run alone (each loading the model itself, as before), one load and one lazy reader per report, and
nothing is shared outside a report."""

# ruff: noqa: F811 - the fixtures imported from test_attention and test_report are parameters of the tests below
from __future__ import annotations

import json
import shlex

import pytest
from test_attention import texts_file, tiny_bert_folder, tiny_model  # noqa: F401 - fixtures
from test_report import causal_folder, record_of, run_report  # noqa: F401 - fixtures

from posprobe.checkpoint import loading, shared, weights
from posprobe.cli import main

TEXT_SECTIONS = "attention,profiles-text,states"


def counted(monkeypatch, module, name: str) -> list:
    """Replace `module.name` by a wrapper that records each call's first argument (the checkpoint)."""
    calls, original = [], getattr(module, name)

    def wrapper(source, *args, **kwargs):
        calls.append(str(source.path))
        return original(source, *args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def alone(summary: dict, name: str, capsys) -> dict:
    """The record of section `name`'s reproducing command, run by itself (its own load)."""
    argv = shlex.split(summary["sections"][name]["command"])[1:]
    capsys.readouterr()
    assert main(argv) in (None, 0)
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def drop_timings(record):
    """A record without its wall-clock fields (the only numbers that differ between two equal runs)."""
    if isinstance(record, dict):
        return {k: drop_timings(v) for k, v in record.items() if k not in ("seconds", "elapsed_s", "wall_s")}
    if isinstance(record, list):
        return [drop_timings(v) for v in record]
    return record


@pytest.mark.slow
@pytest.mark.parametrize(
    "sections",
    ["fhat,profiles," + TEXT_SECTIONS + ",context", "fhat,attention,needle"],
)
def test_a_causal_report_loads_once_and_each_record_equals_its_command_alone(
    causal_folder, texts_file, tmp_path, monkeypatch, capsys, sections
):
    builds = counted(monkeypatch, loading, "_build_model")
    readers = counted(monkeypatch, weights, "_open_weights")
    out = tmp_path / "r"
    summary = run_report([str(causal_folder), "--text", str(texts_file), "--column", "sentence", "--max-texts", "6",
                          "--only", sections, "--out", str(out)])  # fmt: skip
    assert all(summary["sections"][name]["status"] == "ok" for name in sections.split(",")), summary["sections"]
    assert builds == [str(causal_folder)]  # one causal LM: the text sections read its base model
    assert readers == [str(causal_folder)]  # fhat and profiles: one lazy reader
    builds.clear()
    for name in sections.split(","):
        assert drop_timings(alone(summary, name, capsys)) == drop_timings(record_of(out, name)), name
    assert len(builds) == len(set(sections.split(",")) - {"fhat", "profiles"})  # alone: each command loads itself


@pytest.mark.slow
def test_an_encoder_report_loads_its_base_model_once(tiny_bert_folder, texts_file, tmp_path, monkeypatch, capsys):
    builds = counted(monkeypatch, loading, "_build_model")
    out = tmp_path / "r"
    summary = run_report([str(tiny_bert_folder), "--text", str(texts_file), "--column", "sentence", "--only",
                          TEXT_SECTIONS, "--out", str(out)])  # fmt: skip
    assert all(summary["sections"][name]["status"] == "ok" for name in TEXT_SECTIONS.split(",")), summary["sections"]
    assert builds == [str(tiny_bert_folder)]
    for name in TEXT_SECTIONS.split(","):
        assert drop_timings(alone(summary, name, capsys)) == drop_timings(record_of(out, name)), name


def test_nothing_is_shared_outside_a_report_and_attention_is_set_per_request(causal_folder):
    from transformers import AutoModel, AutoModelForCausalLM

    from posprobe.checkpoint import resolve_model

    source = resolve_model(str(causal_folder))
    assert loading.build_model(source, AutoModel) is not loading.build_model(source, AutoModel)
    assert weights.open_weights(source) is not weights.open_weights(source)
    with shared.shared_loads(causal=True):
        causal_lm = loading.build_model(source, AutoModelForCausalLM)
        default = causal_lm.config._attn_implementation
        base = loading.build_model(source, AutoModel, attn_implementation="eager")
        assert base is causal_lm.base_model and base.config._attn_implementation == "eager"
        assert loading.build_model(source, AutoModelForCausalLM) is causal_lm
        assert causal_lm.config._attn_implementation == default  # a request without one: the default again
        assert weights.open_weights(source) is weights.open_weights(source)
    assert shared._active is None


def test_a_model_that_cannot_switch_its_attention_is_built_apart(tmp_path, monkeypatch):
    """A model that transformers says cannot switch its attention after loading (a class outside AttentionInterface,
    as Falcon was before transformers 5.25) is built with its implementation: a request for another one gets its own
    load (as without sharing), never the shared model with the wrong implementation."""
    import transformers as tf
    from test_needle import tiny_causal_lm
    from transformers import AutoModel, AutoModelForCausalLM

    from posprobe.checkpoint import resolve_model

    tiny_causal_lm("llama").save_pretrained(tmp_path)
    for cls in (tf.LlamaForCausalLM, tf.LlamaModel):  # what the auto classes build here, as transformers' cached answer
        monkeypatch.setattr(cls, "_can_set_attn_implementation_cached_value", False, raising=False)
    source = resolve_model(str(tmp_path))
    builds = counted(monkeypatch, loading, "_build_model")
    with shared.shared_loads(causal=True):
        causal_lm = loading.build_model(source, AutoModelForCausalLM)
        assert not causal_lm._can_set_attn_implementation()
        default = causal_lm.config._attn_implementation
        assert default != "eager"
        base = loading.build_model(source, AutoModel, attn_implementation="eager")
        assert base is not causal_lm.base_model and base.config._attn_implementation == "eager"
        assert causal_lm.config._attn_implementation == default
        eager = loading.build_model(source, AutoModelForCausalLM, attn_implementation="eager")
        assert eager is not causal_lm and eager.config._attn_implementation == "eager"
        assert loading.build_model(source, AutoModelForCausalLM) is causal_lm
    assert len(builds) == 3


def test_whether_falcon_switches_is_asked_of_the_installed_transformers(tmp_path, monkeypatch):
    """Falcon's attention switch is what the installed transformers says (`_can_set_attn_implementation`): from 5.25
    on it can switch, and a request for eager gets the shared model switched; before, its own load."""
    from test_needle import tiny_causal_lm
    from transformers import AutoModelForCausalLM

    from posprobe.checkpoint import resolve_model

    tiny_causal_lm("falcon").save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    builds = counted(monkeypatch, loading, "_build_model")
    with shared.shared_loads(causal=True):
        causal_lm = loading.build_model(source, AutoModelForCausalLM, attn_implementation="sdpa")
        eager = loading.build_model(source, AutoModelForCausalLM, attn_implementation="eager")
        assert eager.config._attn_implementation == "eager"
        assert (eager is causal_lm) == causal_lm._can_set_attn_implementation()
    assert len(builds) == (1 if causal_lm._can_set_attn_implementation() else 2)


@pytest.mark.slow
@pytest.mark.parametrize("model, sections", [("causal", ["rotary", "fit-tisa"]), ("bert", ["toeplitz", "profiles"])])
def test_the_weight_sections_run_through_the_library_equal_their_commands_alone(
    causal_folder, tiny_bert_folder, tmp_path, capsys, model, sections
):
    """Sections run through the library (`report.library.RUNS`, no command line parsed, no stdout read): each
    record equals its reproducing command's, run alone (the text sections, context and needle: above)."""
    from posprobe.report.library import RUNS
    from posprobe.report.sections import SECTIONS

    assert {s.command for s in SECTIONS.values()} <= set(RUNS)  # every section: none through the command line
    out = tmp_path / "r"
    folder = causal_folder if model == "causal" else tiny_bert_folder
    summary = run_report([str(folder), "--only", ",".join(sections), "--out", str(out)])
    for name in sections:
        assert summary["sections"][name]["status"] == "ok", summary["sections"][name]
        assert drop_timings(alone(summary, name, capsys)) == drop_timings(record_of(out, name)), name
