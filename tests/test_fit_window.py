"""The fit window of fit-tisa (issue 19): a causal model's default window has at least twice as many points as
parameters, fits with fewer are flagged, every fit is scored on held-out offsets beyond its window, and every piece
of advice a refusal gives is accepted when followed (causal and two-sided, several S and W, library and CLI)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from family_models import build
from typer.testing import CliRunner

from posprobe.analysis.tisa_fit import TisaKernelFitter, tisa_function
from posprobe.analysis.tisa_window import default_window, parameters, points
from posprobe.cli import app, main
from posprobe.errors import ArgumentValueError, PosprobeError
from posprobe.formats.tisa_kernels import read_kernels_file
from posprobe.pipelines.fitting import ProfileSet, fit_tisa

runner = CliRunner()
FAST = dict(restarts=1, max_iter=3)  # where only acceptance, flags and records are checked, not fit quality


@pytest.fixture
def fast_fits(monkeypatch):
    """fit-tisa's fits with the least effort (the checks and the records are the same)."""
    import posprobe.pipelines.fitting as fitting

    monkeypatch.setattr(fitting, "TisaKernelFitter", lambda s, **kw: TisaKernelFitter(s, **FAST, **kw))


def profile_set(n: int = 40, causal: bool = False, heads: int = 1) -> ProfileSet:
    k = np.arange(-(n - 1), n)
    rng = np.random.default_rng(0)
    prof = 1.5 * np.exp(-0.2 * (k + 3.0) ** 2) - 0.02 * np.abs(k) + rng.normal(0, 0.01, (1, heads, k.size))
    return ProfileSet("synthetic", "llama", "content-free", [0], k, prof, 1, heads, False, causal=causal)


# --------------------------------------------------------------------------------------------- the rules
def test_default_windows():
    assert default_window([5], causal=False, available=500) == 16  # 33 points >= 2 x 16 parameters
    assert default_window([5], causal=True, available=500) == 31  # 32 points = 2 x 16 parameters
    assert default_window([1, 3], causal=True, available=500) == 19  # 20 points = 2 x 10 (S = 3)
    assert default_window([1], causal=True, available=500) == 16  # never shorter than the two-sided default
    assert default_window([5], causal=True, available=20) == 20  # clipped to the profiles
    for s in range(1, 12):
        w = default_window([s], causal=True, available=10_000)
        assert points(w, True) >= 2 * parameters(s) and points(w - 1, True) < 2 * parameters(s) or w == 16


def test_causal_default_fit_and_the_few_points_flag(tmp_path):
    data = profile_set(causal=True)
    result = fit_tisa(None, kernels=5, profiles=data)
    fit = result.fits[0]
    assert result.window == 31 and fit.n_points == 32 and not fit.few_points
    assert list(result.holdout_offsets) == list(range(-39, -31))  # the next 8 offsets beyond k = -31
    record = result.to_dict()
    assert record["fitted_offsets"] == [-31, 0] and record["points"] == 32 and record["parameters"] == 16
    assert record["few_points"] is False and record["warnings"] == []
    few = fit_tisa(None, kernels=5, window=16, profiles=data).save(tmp_path)  # 17 points for 16 parameters
    fit = few.fits[0]
    assert fit.few_points and "17 points" in fit.warning(16, True) and "31 or more" in fit.warning(16, True)
    record = few.to_dict()
    assert record["few_points"] is True and record["warnings"] and record["holdout_offsets"] == list(range(-24, -16))
    meta = read_kernels_file(fit.kernels_file).metadata
    assert meta["few_points"] is True and meta["points"] == 17 and meta["parameters"] == 16 and meta["causal"]
    assert meta["holdout_offsets"] == list(range(-24, -16)) and len(meta["holdout_r2"][0]) == 1
    two_sided = fit_tisa(None, kernels=5, profiles=profile_set())
    assert two_sided.window == 16 and two_sided.fits[0].n_points == 33 and not two_sided.fits[0].few_points
    assert list(two_sided.holdout_offsets) == [*range(-24, -16), *range(17, 25)]


def test_holdout_r2_against_an_independent_computation():
    k = np.arange(-30, 31)
    exact = tisa_function(k, np.array([[2.0, -0.5]]), np.array([[0.3, 0.05]]), np.array([[-2.0, 3.0]])) + 0.4
    noisy = exact[0] + np.random.default_rng(1).normal(0, 0.05, k.size)
    fitter = TisaKernelFitter(2, window=10).fit(np.stack([exact[0], noisy]), k)
    held = fitter.holdout_offsets_
    assert list(held) == [*range(-18, -10), *range(11, 19)]
    assert fitter.holdout_r2_[0] > 1 - 1e-6  # a TISA function inside the window extrapolates exactly
    y = noisy[np.isin(k, held)]
    predicted = fitter.predict(held)[1]
    window_mean = noisy[np.abs(k) <= 10].mean()
    expected = 1 - np.sum((y - predicted) ** 2) / np.sum((y - window_mean) ** 2)
    assert fitter.holdout_r2_[1] == pytest.approx(expected, rel=1e-12)
    end = TisaKernelFitter(1, window=30).fit(exact, k)  # the profiles end at the window: nothing held out
    assert end.holdout_offsets_.size == 0 and np.isnan(end.holdout_r2_).all()
    causal = TisaKernelFitter(1, window=10).fit(exact[:, k <= 0], k[k <= 0])
    assert causal.causal_ and list(causal.holdout_offsets_) == list(range(-18, -10)) and causal.n_points_ == 11


# -------------------------------------------------------------------------------------------- the advice
def _advice(err: PosprobeError) -> tuple[int | None, int | None, int | None]:
    """(at most N kernels, a window of at least W, profiles over at least P positions) from a refusal's hint."""
    text = str(err)

    def number(pattern):
        found = re.search(pattern, text)
        return int(found.group(1)) if found else None

    positions = re.search(r"over at least (\d+) positions .* with a window of (\d+) or more", text)
    if positions:
        return number(r"at most (\d+) kernel"), int(positions.group(2)), int(positions.group(1))
    return number(r"at most (\d+) kernel"), number(r"a window of at least (\d+)"), None


@pytest.mark.slow  # a grid of fits per direction
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "two-sided"])
def test_every_piece_of_advice_is_accepted_when_followed(causal, fast_fits):
    fast = FAST
    refused = 0
    for n in (12, 40):
        data = profile_set(n, causal)
        k, y = data.offsets, data.profiles[0]
        if causal:
            k, y = k[k <= 0], y[:, k <= 0]
        for s in (2, 5, 8):
            for w in (None, 2, 4, 7):
                try:
                    fit_tisa(None, kernels=s, window=w, profiles=data)  # the pipeline (its fits run the estimator)
                    continue
                except ArgumentValueError as err:
                    with pytest.raises(ArgumentValueError) as again:
                        TisaKernelFitter(s, window=w, **fast).fit(y, k)  # the estimator: the same rule and advice
                    assert _advice(again.value) == _advice(err)
                    kernels, window, positions = _advice(err)
                refused += 1
                assert kernels is not None or window is not None or positions is not None
                if kernels is not None:
                    assert 1 <= kernels < s
                    assert fit_tisa(None, kernels=kernels, window=w, profiles=data).window == (w or data_window(data))
                if positions is not None:  # longer profiles and that window
                    longer = profile_set(positions, causal)
                    assert fit_tisa(None, kernels=s, window=window, profiles=longer).fits[0].n_points >= parameters(s)
                elif window is not None:
                    assert fit_tisa(None, kernels=s, window=window, profiles=data).window == window
    assert refused >= 6


def data_window(data: ProfileSet) -> int:
    available = -data.offsets.min() if data.causal else min(-data.offsets.min(), data.offsets.max())
    return default_window([1], data.causal, int(available))


def test_the_advice_of_the_issue_on_a_causal_model(tmp_path, capsys, fast_fits):
    """`fit-tisa … --kernels 5 --window 7` on a causal model used to advise 'at most 4 kernels, or a window of at
    least 8', both then refused: the advice is now for the 8 points of k = -7..0, and both are accepted."""
    folder = tmp_path / "llama"
    build("llama").save_pretrained(folder)
    capsys.readouterr()  # the save's own progress line
    base = ["fit-tisa", str(folder), "--layers", "0", "--positions", "40", "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as info:
        main([*base, "--kernels", "5", "--window", "7"])
    message = " ".join(capsys.readouterr().err.split())
    assert info.value.code == 2 and message.startswith("posprobe: error:")
    assert "k = -7..0, a causal model's has 8" in message
    assert "at most 2 kernels" in message and "a window of at least 15" in message
    followed = runner.invoke(app, [*base, "--kernels", "2", "--window", "7", "--json"])
    assert followed.exit_code == 0, followed.output
    record = json.loads(followed.stdout)
    assert record["causal"] is True and record["points"] == 8 and record["parameters"] == 7
    assert record["few_points"] is True and record["warnings"]  # accepted, and flagged
    text = runner.invoke(app, [*base, "--kernels", "5", "--window", "15"])  # accepted, and flagged
    assert text.exit_code == 0 and "warning: S = 5 fits 16 parameters to 16 points" in " ".join(text.output.split())
    assert "held-out" in text.output
    default = json.loads(runner.invoke(app, [*base, "--kernels", "5", "--json"]).stdout)
    assert default["window"] == 31 and default["few_points"] is False and default["fitted_offsets"] == [-31, 0]
    assert default["holdout_offsets"] == list(range(-39, -31))
    assert all(h["holdout_r2"] is None or h["holdout_r2"] <= 1 for h in default["heads"])


def test_too_few_positions_advises_more_positions():
    data = profile_set(10, causal=True)  # k = -9..0: at most 10 points
    with pytest.raises(ArgumentValueError) as info:
        fit_tisa(None, kernels=5, profiles=data)  # 16 parameters
    kernels, window, positions = _advice(info.value)
    assert kernels == 3 and window == 15 and positions == 16
    assert fit_tisa(None, kernels=5, profiles=profile_set(positions, causal=True)).window == 15  # the default too


def test_a_causal_attention_file_is_fitted_over_k_up_to_0(tmp_path, fast_fits):
    """`posprobe attention` on a causal model has data at k <= 0 only: fit-tisa fits that side (it used to refuse)."""
    from posprobe.formats.writing import save_npz

    n = 30
    k = np.arange(-(n - 1), n)
    scores = np.where(k <= 0, np.exp(-0.1 * (k + 2.0) ** 2), np.nan)[None, None].repeat(2, 1)  # (1 layer, 2 heads)
    meta = {"model": "m", "model_type": "llama", "causal": True, "layers": [0], "n_layers": 1, "mode": "empirical"}
    path = tmp_path / "attention.npz"
    save_npz(path, meta, score_profiles=scores, prob_profiles=scores, offsets=k, profiles=scores)
    result = fit_tisa(str(path), kernels=2)
    assert result.causal and result.mode == "empirical-score" and result.window == 16
    assert result.profiles.shape[-1] == n and result.offsets.max() == 0
    assert list(result.holdout_offsets) == list(range(-24, -16))
    nothing = np.where(k < 0, np.nan, 1.0)[None, None]
    save_npz(path, meta, score_profiles=nothing, prob_profiles=nothing, offsets=k, profiles=nothing)
    with pytest.raises(PosprobeError, match="no data at k = -1..0"):
        fit_tisa(str(path), kernels=1)
