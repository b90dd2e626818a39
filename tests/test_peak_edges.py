"""Peaks at the edge (issue 49): a profile that rises to the outermost offset it covers has no peak inside; its cell
says 'edge' (the `profiles` table, the report's table), and the report's reading is built on the heads that peak
inside. Profiles here are built by hand, so which heads are at the edge is known by construction."""

from __future__ import annotations

import numpy as np

from posprobe.pipelines.weights_results import ProfileResult
from posprobe.report.sections import SECTIONS, ModelFacts


def hand_profiles(causal: bool, layer_kinds=None) -> ProfileResult:
    """n = 8 positions (k = -7..7), 2 layers x 3 heads: head 0 rises to k = -7 (an edge), head 1 peaks at k = -1,
    head 2 rises to k = +7 (an edge unless causal: then its best usable k is 0)."""
    n, k = 8, np.arange(-7, 8)
    rows = [-np.abs(k + 7) * 1.0, -np.abs(k + 1) * 1.0, k * 1.0]
    profiles = np.stack([np.stack(rows), np.stack(rows)])  # (2, 3, 15)
    return ProfileResult(model="hand", model_type="bert", mode="weights", layers=[0, 1], offsets=k, profiles=profiles,
                         fhat_r2=np.full((2, 3), np.nan), window=3, section_rows=[0], sections=np.zeros((2, 3, 1, 7)),
                         n_positions=n, n_heads=3, n_layers=2, shared_layers=False, causal=causal,
                         layer_kinds=layer_kinds)  # fmt: skip


def test_edges_are_the_outermost_usable_offsets():
    both = hand_profiles(causal=False)
    assert both.peak_offsets().tolist() == [[-7, -1, 7], [-7, -1, 7]]
    assert both.peak_at_edge().tolist() == [[True, False, True], [True, False, True]]
    causal = hand_profiles(causal=True)  # k > 0 never used: head 2's best is k = 0, its own token, not an edge
    assert causal.peak_offsets().tolist() == [[-7, -1, 0], [-7, -1, 0]]
    assert causal.peak_at_edge().tolist() == [[True, False, False], [True, False, False]]
    local = hand_profiles(causal=False, layer_kinds=["local |k| <= 3", "global"])  # layer 0 sees |k| <= 3 only
    assert local.peak_offsets().tolist() == [[-3, -1, 3], [-7, -1, 7]]
    assert local.peak_at_edge().tolist() == [[True, False, True], [True, False, True]]
    texts = hand_profiles(causal=False)  # from texts of 5 tokens: offsets past ±4 hold nothing (NaN)
    texts.profiles[:, :, np.abs(np.arange(-7, 8)) > 4] = np.nan
    assert texts.peak_offsets().tolist() == [[-4, -1, 4], [-4, -1, 4]]
    assert texts.peak_at_edge().tolist() == [[True, False, True], [True, False, True]]
    record = both.to_dict()
    assert [h["peak_at_edge"] for h in record["heads"]] == [True, False, True] * 2


def test_report_cells_say_edge_and_the_reading_is_on_the_heads_inside():
    record = hand_profiles(causal=False).to_dict() | {"figures": []}
    facts = ModelFacts("hand", "bert", "learned", "a learned table", False, True, 2, 8)
    view = SECTIONS["profiles"].view(record, facts)
    assert [list(row) for row in view.table.rows] == [["0", "edge", "-1", "edge"], ["1", "edge", "-1", "edge"]]
    edge = "edge: 4 of 6 heads peak at the outermost offset they cover (±7)"
    assert any(note.startswith(edge) for note in view.notes)
    assert "2 heads peak inside; most often at k = -1 (2 heads)" in view.notes


def test_profiles_table_says_edge(capsys):
    from posprobe.cli.weights import _print_peaks

    _print_peaks(hand_profiles(causal=False), "hand")
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1] in "01" and "edge" in line]
    assert rows == [["0", "edge", "-1", "edge"], ["1", "edge", "-1", "edge"]]
    assert "edge: 4 heads peak at the outermost offset they cover (k = ±7)" in out.replace("\n", " ")
