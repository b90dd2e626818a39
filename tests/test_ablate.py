"""`posprobe ablate` (issue 46) on tiny in-code models: every effect, interval and p-value recomputed from the
run's own per-window or per-prompt records by independent code here (numpy, scipy's t quantile, an enumeration of
sign patterns); the baseline recomputed by plain transformers; selections and controls as specified; hostile input
one line, exit 2, nothing written."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch
from test_attention import tiny_bert_folder  # noqa: F401 - a fixture
from test_hostile import assert_one_line_error, run_cli
from test_hostile import tiny_llama_folder as tiny_llama_folder  # noqa: F401 - a fixture
from test_needle import HAYSTACK, TASK, char_tokenizer, planted_llama, tiny_causal_lm

from posprobe.pipelines.ablate import ablate
from posprobe.pipelines.needle import NeedleGrid


def paired(values, baseline):
    """(mean, [lo, hi], p) of d = values - baseline: t interval with n - 1 d.o.f., exact two-sided sign-flip p."""
    from scipy.stats import t

    d = np.asarray(values, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    n = len(d)
    half = t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
    sums = [abs(sum(s * x for s, x in zip(signs, d))) for signs in itertools.product((1, -1), repeat=n)]
    p = sum(x >= abs(d.sum()) - 1e-12 * max(1.0, np.abs(d).sum()) for x in sums) / 2**n
    return d.mean(), [d.mean() - half, d.mean() + half], p


def check_record(record, units_of):
    """Every run's and control's value, delta, interval and p in `record` from the per-unit values `units_of`
    (label -> values) alone."""
    base = np.asarray(units_of["baseline"])
    assert record["baseline"] == pytest.approx(base.mean(), abs=1e-12)
    for entry in record["runs"] + record["controls"]:
        label = entry["edit"] if "seed" not in entry else f"control seed {entry['seed']}"
        values = np.asarray(units_of[label])
        delta, interval, p = paired(values, base)
        assert entry["value"] == pytest.approx(values.mean(), abs=1e-12)
        assert entry["delta"] == pytest.approx(delta, abs=1e-12)
        np.testing.assert_allclose(entry["interval"], interval, atol=1e-10)
        assert entry["p"] == pytest.approx(p, abs=1e-12)


@pytest.fixture(scope="module")
def context_run():
    model = tiny_causal_lm()
    result = ablate(model, ["head:sink:2", "attend:1,20", "head:0.1+head:1.2"], readout="context",
                    tokenizer=char_tokenizer(), texts=HAYSTACK, length=64, windows=5, from_position=8, control=2,
                    seeds=3)  # fmt: skip
    return result, model


def test_context_effects_are_recomputed_from_the_window_records(context_run, tmp_path):
    result, model = context_run
    result.save(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "windows.jsonl").read_text().splitlines()]
    assert len(rows) == 5
    units_of = {label: [row["values"][label] for row in rows] for label in rows[0]["values"]}
    record = json.loads((tmp_path / "ablate.json").read_text())
    check_record(record, units_of)
    assert [r["edit"] for r in record["runs"]] == ["head:sink:2", "attend:1,20", "head:0.1+head:1.2"]
    assert record["runs"][2]["heads"] == [[0, 1], [1, 2]]
    # the controls: 2 random heads each, distinct from the target's (head:sink:2, the first run acting on heads)
    target = {tuple(h) for h in record["runs"][0]["heads"]}
    assert len(target) == 2 and record["control_of"] == "head:sink:2"
    for control in record["controls"]:
        assert len(control["heads"]) == 2 and not target & {tuple(h) for h in control["heads"]}
    assert len({tuple(map(tuple, c["heads"])) for c in record["controls"]}) > 1
    versus = record["versus_controls"]
    target_units = np.asarray(units_of["head:sink:2"])
    controls = np.asarray([units_of[f"control seed {s}"] for s in range(3)])
    base = np.asarray(units_of["baseline"])
    deltas = (controls - base).mean(1)
    assert versus["control_deltas"] == pytest.approx(list(deltas), abs=1e-12)
    extreme = np.sum(np.abs(deltas) >= abs((target_units - base).mean()) - 1e-12)
    assert versus["share_as_extreme"] == pytest.approx((1 + extreme) / 4)
    delta, interval, p = paired(target_units, controls.mean(0))
    assert versus["paired"]["delta"] == pytest.approx(delta, abs=1e-12)
    assert versus["paired"]["p"] == pytest.approx(p, abs=1e-12)


def test_context_baseline_equals_plain_transformers(context_run):
    """The baseline's per-window value is the plain model's mean cross-entropy over the tokens at positions >= 8;
    the windows are the texts' characters cut in order (no BOS: the char tokenizer adds none)."""
    result, model = context_run
    tokenizer = char_tokenizer()
    ids = tokenizer(HAYSTACK[0], add_special_tokens=False)["input_ids"]
    model.set_attn_implementation("eager")
    for i, value in enumerate(result.baseline.units):
        window = torch.tensor([ids[i * 64 : (i + 1) * 64]])
        with torch.no_grad():
            logits = model(input_ids=window).logits[0].double()
        nll = torch.nn.functional.cross_entropy(logits[:-1], window[0, 1:], reduction="none")
        assert value == pytest.approx(float(nll[7:].mean()), abs=1e-5)


def test_head_sink_selects_the_baselines_first_token_mass(context_run):
    """head:sink:2 zeroes the two heads whose attention from queries i >= 1 on key 0 is largest, measured here by
    plain transformers' eager attention on the same windows."""
    result, model = context_run
    tokenizer = char_tokenizer()
    ids = tokenizer(HAYSTACK[0], add_special_tokens=False)["input_ids"]
    model.set_attn_implementation("eager")
    mass = []
    with torch.no_grad():
        for i in range(5):
            out = model(input_ids=torch.tensor([ids[i * 64 : (i + 1) * 64]]), output_attentions=True)
            mass.append(torch.stack([a[0, :, 1:, 0].double().mean(-1) for a in out.attentions]).numpy())
    mean = np.mean(mass, axis=0)  # (L, H)
    np.testing.assert_allclose(result.baseline.head_scores["sink"], mean, atol=1e-6)
    top = sorted(np.argsort(-mean, axis=None)[:2])
    assert sorted(int(a) * 4 + int(b) for a, b in result.runs[0].heads) == [int(x) for x in top]


def test_needle_effects_and_prompt_records(tmp_path):
    model, tokenizer = planted_llama()
    grid = NeedleGrid(lengths=(120,), depths=(0.0, 1.0), trials=2, seed=2)
    result = ablate(model, ["head:retrieval:2", "head:0.2,1.1"], readout="needle", tokenizer=tokenizer,
                    haystack=HAYSTACK, task=TASK, grid=grid, control=2, seeds=2)  # fmt: skip
    result.save(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {"length", "depth", "trial", "answer", "needle_span"} <= set(rows[0])
    units_of = {label: [row["values"][label] for row in rows] for label in rows[0]["values"]}
    record = result.to_dict()
    check_record(record, units_of)
    assert record["metric"] == "mean answer log-probability (nats)" and record["readout"] == "needle"
    assert record["runs"][1]["heads"] == [[0, 2], [1, 1]]
    assert all(len(c["heads"]) == 2 for c in record["controls"])
    # the per-prompt values are the needle command's own log-probabilities with the same edits
    from posprobe.pipelines.needle import needle

    direct = needle(model, tokenizer=tokenizer, haystack=HAYSTACK, grid=grid, task=TASK, edits=["head:0.2,1.1"])
    np.testing.assert_allclose(units_of["head:0.2,1.1"], direct.log_prob.reshape(-1), atol=1e-9)
    assert {"ablate_effects.png", "ablate_grid.png", "ablate.npz", "ablate.txt"} <= {p.name for p in tmp_path.iterdir()}


@pytest.mark.parametrize(
    "args, words",
    [
        (["--edit", "head:99.0"], ["head:99.0"]),
        (["--edit", "head:0.77"], ["head:0.77"]),
        (["--edit", "warp:3"], ["warp"]),
        (["--edit", "head:0.1=nan"], ["head:0.1=nan"]),
        (["--edit", "attend:-1,4"], ["attend"]),
        (["--edit", "head:retrieval:3"], ["retrieval", "needle"]),
        (["--edit", "head:0.1", "--control", "random:x"], ["random:K"]),
        (["--edit", "attend:1,4", "--control", "random:2"], ["control"]),
        (["--edit", "head:0.1", "--readout", "loss"], ["readout"]),
        (["--edit", "head:0.1", "--windows", "1"], ["windows"]),
        (["--edit", "head:0.1+"], ["+"]),
        ([], ["edit"]),
    ],
)
def test_hostile_input_is_one_line_and_writes_nothing(args, words, tiny_llama_folder, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["ablate", tiny_llama_folder, *args, "--out", out, "--length", "16"], capsys)
    assert_one_line_error(code, stdout, stderr, *words)
    assert not out.exists()


def test_cli_json_keys_and_files(tiny_llama_folder, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["ablate", tiny_llama_folder, "--edit", "head:0.1", "--edit", "attend:1,4+shift:3", "--length", "16",
            "--windows", "3", "--control", "random:1", "--seeds", "2", "--out", out, "--json"]  # fmt: skip
    code, stdout, stderr = run_cli(args, capsys)
    assert code == 0, stderr
    record = json.loads(stdout)
    assert {"readout", "metric", "baseline", "runs", "controls", "files"} <= set(record)
    assert [r["edit"] for r in record["runs"]] == ["head:0.1", "attend:1,4+shift:3"]
    assert {"edit", "heads", "value", "delta", "interval"} <= set(record["runs"][0])
    assert [c["seed"] for c in record["controls"]] == [0, 1] and {"heads", "value", "delta"} <= set(
        record["controls"][0]
    )
    assert {"windows", "ablate", "ablate_effects", "ablate_loss"} <= set(record["files"])
    rows = (out / "windows.jsonl").read_text().splitlines()
    assert len(rows) == 3
