"""Summaries over k of a causal model look at k <= 0 only (issue 19): it never uses k > 0, so a peak there would
describe nothing it does. Checked on hand-made profiles (where the answer is known) and on a tiny rotary model
against an independent argmax, through the library, the JSON and the text table."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
from family_models import build
from typer.testing import CliRunner

import posprobe
from posprobe.cli import app

N, W = 24, 6


def test_peak_offset_of_a_causal_profile_is_at_k_up_to_0():
    result = posprobe.profiles(build("llama"), layers=[0], positions=N, window=W)
    k = result.offsets
    shaped = np.stack([np.exp(-0.5 * (k - 3.0) ** 2) + 0.5 * np.exp(-0.5 * (k + 2.0) ** 2),  # global max at k = +3
                       np.exp(-0.5 * (k + 4.0) ** 2)])[None]  # fmt: skip
    causal = replace(result, profiles=shaped, n_heads=2)
    assert causal.causal and causal.peak_offsets().tolist() == [[-2, -4]]  # the best k <= 0, not +3
    assert [h["peak_offset"] for h in json.loads(causal.to_json())["heads"]] == [-2, -4]
    two_sided = replace(causal, causal=False)
    assert two_sided.peak_offsets().tolist() == [[3, -4]]


def test_peak_offsets_of_a_rotary_model_against_an_independent_argmax(tmp_path):
    folder = tmp_path / "llama"
    build("llama").save_pretrained(folder)
    runner = CliRunner()
    done = runner.invoke(app, ["profiles", str(folder), "--positions", str(N), "--window", str(W),
                               "--out", str(tmp_path / "p"), "--json"])  # fmt: skip
    assert done.exit_code == 0, done.output
    record = json.loads(done.stdout)
    with np.load(record["npz"]) as z:
        profiles, offsets = z["profiles"], z["offsets"]
    allowed = (offsets >= -W) & (offsets <= 0)
    expected = offsets[allowed][np.argmax(profiles[..., allowed], axis=-1)]  # (L, H)
    assert [h["peak_offset"] for h in record["heads"]] == expected.ravel().tolist()
    assert all(h["peak_offset"] <= 0 for h in record["heads"])
    text = runner.invoke(app, ["profiles", str(folder), "--positions", str(N), "--window", str(W),
                               "--out", str(tmp_path / "q")])  # fmt: skip
    assert "peaks over k ≤ 0" in text.output
    cells = [c for line in text.output.splitlines() for c in line.split() if c[:1] in "+-" and c[1:].isdigit()]
    assert cells and all(int(c) <= 0 for c in cells)
