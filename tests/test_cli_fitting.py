"""`posprobe fit-tisa` and `posprobe params` through typer's runner, plus the fitting pipeline's files:
kernels-file round trip, sweeps, ALBERT replication, .npz input, flat heads, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from posprobe.cli import app, main
from posprobe.errors import PosprobeError
from posprobe.formats.tisa_kernels import load_tisa_kernels
from posprobe.pipelines.fitting import ProfileSet, fit_tisa

runner = CliRunner()


def run_json(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def synthetic(n_layers=2, n_heads=3, n=24, shared=False, flat_head=None) -> ProfileSet:
    k = np.arange(-(n - 1), n)
    rng = np.random.default_rng(0)
    prof = np.empty((n_layers, n_heads, k.size))
    for layer in range(n_layers):
        for h in range(n_heads):
            centre = rng.uniform(-3, 3)
            prof[layer, h] = 2.0 * np.exp(-0.4 * (k - centre) ** 2) - 0.01 * np.abs(k) + rng.normal(0, 0.01, k.size)
    if flat_head is not None:
        prof[:, flat_head] = 0.25
    if shared:
        prof[:] = prof[:1]
    return ProfileSet("synthetic", "bert", "paper", list(range(n_layers)), k, prof, n_layers, n_heads, shared)


# ---------------------------------------------------------------------------------------- pipeline
def test_kernels_file_round_trip_and_metadata(tmp_path):
    result = fit_tisa(None, kernels=3, profiles=synthetic(flat_head=1)).save(tmp_path, "svg")
    fit = result.fits[0]
    assert fit.kernels_file == tmp_path / "tisa_kernels_S3.safetensors" and fit.kernels_file.is_file()
    assert fit.figure == tmp_path / "tisa_fit_S3.svg" and fit.figure.is_file()
    a, b, c, meta = load_tisa_kernels(fit.kernels_file)
    assert a.shape == b.shape == c.shape == (2, 3, 3) and meta["offset"].shape == (2, 3)
    np.testing.assert_allclose(a, fit.a, rtol=1e-6, atol=1e-7)  # float32 storage
    np.testing.assert_allclose(b, fit.b, rtol=1e-6)
    np.testing.assert_allclose(c, fit.c, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(meta["offset"], fit.offset, rtol=1e-6)
    assert meta["convention"] == "k = j - i" and meta["n_kernels"] == 3 and meta["window"] == 16
    assert meta["layers"] == [0, 1] and meta["shared_layers"] is False and meta["mode"] == "paper"
    assert np.allclose(meta["r2"], fit.r2, atol=1e-6)
    assert all(np.isfinite(x).all() for x in (a, b, c, meta["offset"]))  # flat head: zeros, not NaN
    assert np.all(a[:, 1] == 0) and "flat" in meta["flags"][0][1]
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_sweep_writes_one_file_per_s(tmp_path):
    result = fit_tisa(None, kernels=[1, 3, 5], window=8, profiles=synthetic()).save(tmp_path)
    assert [f.n_kernels for f in result.fits] == [1, 3, 5] and result.window == 8
    for s in (1, 3, 5):
        a, _, _, meta = load_tisa_kernels(tmp_path / f"tisa_kernels_S{s}.safetensors")
        assert a.shape == (2, 3, s) and meta["n_kernels"] == s
    r2 = [f.median_r2 for f in result.fits]
    assert r2[0] <= r2[1] + 1e-9 <= r2[2] + 2e-9  # more kernels never fit worse
    record = result.to_dict()
    assert record["kernels"] == [1, 3, 5] and [f["kernels"] for f in record["fits"]] == [1, 3, 5]
    assert record["seconds"] == pytest.approx(sum(f["seconds"] for f in record["fits"]), abs=1e-3)


def test_shared_layers_fit_once_and_replicate(tmp_path):
    result = fit_tisa(None, kernels=2, profiles=synthetic(n_layers=4, shared=True)).save(tmp_path)
    a, b, c, meta = load_tisa_kernels(result.fits[0].kernels_file)
    assert a.shape == (4, 3, 2) and meta["shared_layers"] is True
    for layer in range(1, 4):
        np.testing.assert_array_equal(a[layer], a[0])
        np.testing.assert_array_equal(c[layer], c[0])


def test_npz_profiles_input(tmp_path):
    from posprobe.formats.writing import save_npz

    data = synthetic(n_layers=3)
    path = save_npz(
        tmp_path / "profiles_paper.npz",
        {"model": "tiny", "mode": "faithful", "n_layers": 3, "shared_layers": False},
        profiles=data.profiles,
        offsets=data.offsets,
        layers=np.arange(3),
    )
    result = fit_tisa(str(path), kernels=1, layers=[2, 0])
    assert result.model == "tiny" and result.mode == "faithful" and result.layers == [2, 0]
    assert result.fits[0].a.shape == (2, 3, 1)
    with pytest.raises(PosprobeError, match="not in"):
        fit_tisa(str(path), kernels=1, layers=[7])
    with pytest.raises(PosprobeError, match="does not exist"):
        fit_tisa(str(tmp_path / "missing.npz"), kernels=1)


def test_bad_kernels_files(tmp_path):
    with pytest.raises(PosprobeError, match="does not exist"):
        load_tisa_kernels(tmp_path / "nope.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file at all")
    with pytest.raises(PosprobeError, match="cannot read"):
        load_tisa_kernels(junk)
    from safetensors.numpy import save_file

    plain = tmp_path / "plain.safetensors"
    save_file({"a": np.zeros((1, 2, 3), np.float32)}, str(plain))
    with pytest.raises(PosprobeError, match="no posprobe metadata"):
        load_tisa_kernels(plain)
    partial = tmp_path / "partial.safetensors"
    save_file({"a": np.zeros((1, 2, 3), np.float32)}, str(partial), metadata={"posprobe": "{}"})
    with pytest.raises(PosprobeError, match="lacks"):
        load_tisa_kernels(partial)


def test_pipeline_bad_input(tmp_path):
    data = synthetic()
    for kernels in (0, [], [3, -1]):
        with pytest.raises(PosprobeError):
            fit_tisa(None, kernels=kernels, profiles=data)
    with pytest.raises(PosprobeError, match="larger than"):
        fit_tisa(None, kernels=1, window=500, profiles=data)
    with pytest.raises(PosprobeError, match="format"):
        fit_tisa(None, kernels=1, profiles=data).save(tmp_path, "gif")
    bad = synthetic()
    bad.profiles[0, 0, 3] = np.nan
    with pytest.raises(PosprobeError, match="NaN"):
        fit_tisa(None, kernels=1, profiles=bad)
    assert not list(tmp_path.glob("*.safetensors"))


# --------------------------------------------------------------------------------------------- CLI
def test_fit_tisa_cli_json_contract(tiny_checkpoints, tmp_path):
    folder = str(tiny_checkpoints["bert"])
    record = run_json(["fit-tisa", folder, "--kernels", "3", "--window", "10", "--out", str(tmp_path), "--json"])
    assert record["model"] == folder and record["kernels"] == 3 and record["window"] == 10
    assert record["mode"] == "paper" and isinstance(record["seconds"], float)
    heads = record["heads"]
    assert [(h["layer"], h["head"]) for h in heads] == [(l, h) for l in range(2) for h in range(4)]
    assert all(len(h["a"]) == len(h["b"]) == len(h["c"]) == 3 and 0 <= h["r2"] <= 1 for h in heads)
    a, b, c, meta = load_tisa_kernels(record["kernels_file"])
    assert a.shape == (2, 4, 3)
    np.testing.assert_allclose(a[1, 2], heads[4 + 2]["a"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(c[0, 3], heads[3]["c"], rtol=1e-6, atol=1e-6)
    assert (tmp_path / "tisa_fit_S3.png").is_file()


@pytest.mark.slow
def test_fit_tisa_cli_sweep_albert_and_human_output(tiny_checkpoints, tmp_path):
    record = run_json(
        [
            "fit-tisa",
            str(tiny_checkpoints["albert"]),
            "--kernels",
            "1,2",
            "--layers",
            "0,1",
            "--mode",
            "faithful",
            "--out",
            str(tmp_path),
            "--json",
        ]
    )
    assert record["kernels"] == [1, 2] and record["shared_layers"] is True and record["mode"] == "faithful"
    for fit in record["fits"]:
        by_layer = {}
        for h in fit["heads"]:
            by_layer.setdefault(h["head"], []).append(h["c"])
        assert all(cs[0] == cs[1] for cs in by_layer.values())  # one shared layer, replicated
    result = runner.invoke(
        app, ["fit-tisa", str(tiny_checkpoints["bert"]), "--kernels", "1,2", "--out", str(tmp_path / "human")]
    )
    assert result.exit_code == 0, result.output
    assert "sweep" in result.output and (tmp_path / "human" / "tisa_kernels_S2.safetensors").is_file()


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--kernels", "0"], "kernels"),
        (["--kernels", "x"], "kernels"),
        (["--window", "1000"], "window"),
        (["--layers", "9"], ""),
    ],
)
def test_fit_tisa_cli_errors(tiny_checkpoints, tmp_path, capsys, args, fragment):
    with pytest.raises(SystemExit) as info:
        main(["fit-tisa", str(tiny_checkpoints["bert"]), "--out", str(tmp_path), *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("posprobe: error:") and fragment in err and len(err.strip().splitlines()) == 1


def test_params_cli(tiny_checkpoints):
    record = run_json(["params", str(tiny_checkpoints["roberta"]), "--json", "--radius", "2"])
    assert record["n_positions"] == 64 and record["reserved_rows"] == 2  # 66 rows, pad 1 -> 2 reserved
    assert record["absolute"] == 64 * 32 and record["untied"] == 64 * 32 + 2 * 32 * 32
    assert record["tisa"]["5"] == 3 * 5 * 4 * 2 and record["fixed_conv"] == 4 * 5 * 2
    assert record["dynamic_conv"] == 5 * 8 * 2 and record["composite"] == 4 * 5 * 2 + 5 * 8 * 2
    result = runner.invoke(app, ["params", str(tiny_checkpoints["albert"])])
    assert result.exit_code == 0 and "TISA, S=5" in result.output and "factorised" in result.output


def test_cli_module_import_is_light():
    import subprocess
    import sys

    code = (
        "import sys, posprobe.cli.fitting; "
        "bad = [m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_progress_chunks_give_the_same_fit():
    """With a progress callback the heads are fitted in chunks; each head's fit is independent of its
    batch, so the numbers are identical, and progress reaches the total."""
    data = synthetic(n_layers=4, n_heads=5)
    calls = []
    chunked = fit_tisa(None, kernels=[2, 3], profiles=data, progress=lambda *a: calls.append(a))
    whole = fit_tisa(None, kernels=[2, 3], profiles=data)
    for f, g in zip(chunked.fits, whole.fits):
        for name in ("a", "b", "c", "offset", "r2"):
            np.testing.assert_array_equal(getattr(f, name), getattr(g, name))
        assert f.flags == g.flags
    assert ("S = 3", 20, 20) in calls and len({c for c in calls if c[0] == "S = 2"}) > 2


def test_too_many_kernels_for_the_window_refused_before_work():
    data = synthetic()
    with pytest.raises(PosprobeError, match="kernels 11 needs 34 profile points"):
        fit_tisa(None, kernels=[1, 11], profiles=data)  # default window 16: 33 points
    with pytest.raises(PosprobeError, match="window k = -2..2 has 5"):
        fit_tisa(None, kernels=2, window=2, profiles=data)  # 7 parameters, 5 points
    assert fit_tisa(None, kernels=1, window=2, profiles=data).window == 2  # 4 parameters, 5 points


def test_partial_fit_never_replaces_a_full_fit(tiny_checkpoints, tmp_path):
    folder = str(tiny_checkpoints["bert"])
    full = run_json(["fit-tisa", folder, "--kernels", "2", "--out", str(tmp_path), "--json"])
    before = (tmp_path / "tisa_kernels_S2.safetensors").read_bytes()
    part = run_json(["fit-tisa", folder, "--kernels", "2", "--layers", "1", "--out", str(tmp_path), "--json"])
    assert full["kernels_file"].endswith("tisa_kernels_S2.safetensors")
    assert part["kernels_file"].endswith("tisa_kernels_S2_layers1.safetensors")
    assert part["figure"].endswith("tisa_fit_S2_layers1.png")
    assert (tmp_path / "tisa_kernels_S2.safetensors").read_bytes() == before
    a, _, _, meta = load_tisa_kernels(part["kernels_file"])
    assert a.shape == (1, 4, 2) and meta["layers"] == [1]


def test_a_causal_models_profiles_are_fitted_over_k_up_to_0():
    """SPEC §9: a causal model only uses k <= 0, so its fit must not bend to what the scores would be at k > 0
    (a T5 decoder's flat bucket-0 plateau, noise here): one Gaussian at k = -2 is recovered exactly."""
    from dataclasses import replace

    k = np.arange(-23, 24)
    rng = np.random.default_rng(1)
    clean = 1.5 * np.exp(-0.3 * (k + 2.0) ** 2) + 0.2
    prof = np.where(k <= 0, clean, rng.normal(0, 3, k.size))[None, None, :]
    data = ProfileSet("synthetic", "gpt2", "paper", [0], k, prof, 1, 1, False, causal=True)
    fit = fit_tisa(None, kernels=1, window=16, profiles=data).fits[0]
    assert fit.r2[0, 0] > 1 - 1e-9
    np.testing.assert_allclose([fit.a[0, 0, 0], fit.b[0, 0, 0], fit.c[0, 0, 0]], [1.5, 0.3, -2.0], rtol=1e-6)
    two_sided = fit_tisa(None, kernels=1, window=16, profiles=replace(data, causal=False)).fits[0]
    assert two_sided.r2[0, 0] < 0.9  # the same profile fitted on both sides is not recovered
    with pytest.raises(PosprobeError, match=r"k = -4..0, a causal model's has 5"):
        fit_tisa(None, kernels=2, window=4, profiles=data)
