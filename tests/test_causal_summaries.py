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
    allowed = offsets <= 0  # every offset the model uses, not only the figure window
    expected = offsets[allowed][np.argmax(profiles[..., allowed], axis=-1)]  # (L, H)
    assert [h["peak_offset"] for h in record["heads"]] == expected.ravel().tolist()
    assert all(h["peak_offset"] <= 0 for h in record["heads"])
    text = runner.invoke(app, ["profiles", str(folder), "--positions", str(N), "--window", str(W),
                               "--out", str(tmp_path / "q")])  # fmt: skip
    assert "peaks over k ≤ 0" in text.output
    cells = [c.rstrip("*") for line in text.output.splitlines() for c in line.split()
             if c[:1] in "+-" and c.rstrip("*")[1:].isdigit()]  # fmt: skip
    assert cells and all(int(c) <= 0 for c in cells)


def test_a_peak_beyond_the_figure_window_is_the_true_maximum_and_is_marked(tmp_path):
    """A profile rising towards k = -(n-1) peaks there, not at the window's edge -W (issue 38 item 3); the JSON
    says it is beyond the window, the text table stars it, the figure's panel title names it."""
    from posprobe.plotting.profiles import profile_pages

    result = posprobe.profiles(build("llama"), layers=[0], positions=N, window=W)
    k = result.offsets
    shaped = np.stack([-np.abs(k + 15.0), np.exp(-0.5 * (k + 2.0) ** 2)])[None]  # peaks at -15 and at -2
    r = replace(result, profiles=shaped, n_heads=2, sections=result.sections[:, :2])
    assert r.peak_offsets().tolist() == [[-15, -2]]
    assert r.peak_beyond_window().tolist() == [[True, False]]
    heads = json.loads(r.to_json())["heads"]
    assert [h["peak_beyond_window"] for h in heads] == [True, False]
    pages = profile_pages(r)
    assert pages.panel_titles[0] == ["head 0 (peak -15)", "head 1"] and "beyond the drawn" in pages.page_titles[0]


def test_a_local_layer_peaks_within_its_window():
    """Gemma 3's sliding layer (window 5: |k| <= 4) cannot use k = -10; its peak is sought within -4..0; the global
    layer may peak anywhere k <= 0."""
    result = posprobe.profiles(build("gemma3_text"), layers=[0, 1], positions=N, window=W)
    assert result.layer_reach() == [4, None]
    k = result.offsets
    rising = np.broadcast_to(-np.abs(k + 10.0), result.profiles.shape[1:])  # the maximum at k = -10
    r = replace(result, profiles=np.stack([rising, rising]))
    peaks = r.peak_offsets()
    assert (peaks[0] == -4).all() and (peaks[1] == -10).all()
