"""Every family through fhat / profiles / fit-tisa / compare (CLI and library), --positions, --layers all,
causal marking, and toeplitz pointing a rotary model to the commands that show its positional structure."""

from __future__ import annotations

import json

import numpy as np
import pytest
from family_models import build
from typer.testing import CliRunner

import posprobe
from posprobe.cli import app, main
from posprobe.errors import ArgumentValueError

runner = CliRunner()


@pytest.fixture(scope="module")
def family_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    folders = {}
    for family in ("llama", "bloom", "gpt_neox"):
        folders[family] = root / family
        build(family).save_pretrained(folders[family])
    return folders


def run_json(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_fhat_rotary(family_checkpoints, tmp_path):
    record = run_json(["fhat", str(family_checkpoints["llama"]), "--layer", "-1", "--positions", "16",
                       "--out", str(tmp_path), "--json"])  # fmt: skip
    assert record["mode"] == "content-free" and record["position_kind"] == "rotary" and record["causal"] is True
    assert record["layer"] == 1 and record["n_positions"] == 16 and len(record["heads"]) == 4
    assert (tmp_path / "fhat_layer1_content-free.json").is_file()
    default = posprobe.fhat(str(family_checkpoints["llama"]))
    assert default.matrices.shape == (4, 64, 64)  # min(max_position_embeddings = 64, 512)
    assert "causal" in default.plot().title


@pytest.mark.parametrize("family", ["llama", "bloom", "gpt_neox"])
def test_profiles_npz_contract(family_checkpoints, family, tmp_path):
    record = run_json(["profiles", str(family_checkpoints[family]), "--layers", "all", "--positions", "12",
                       "--window", "4", "--out", str(tmp_path), "--json"])  # fmt: skip
    assert record["causal"] is True and "only k <= 0" in record["convention"]
    with np.load(record["npz"]) as npz:
        assert npz["profiles"].shape == (2, 4, 23) and list(npz["layers"]) == [0, 1]
        assert list(npz["offsets"]) == list(range(-11, 12))
    result = posprobe.profiles(str(family_checkpoints[family]), positions=12, window=4)
    f = posprobe.fhat(str(family_checkpoints[family]), layer=1, positions=12).matrices
    brute = [np.mean(np.diagonal(f[0], offset=k)) for k in range(-11, 12)]  # diagonal k = j - i
    np.testing.assert_allclose(result.profile(1, 0), brute, rtol=1e-12, atol=1e-12)


def test_alibi_profile_is_linear_in_distance(family_checkpoints):
    result = posprobe.profiles(str(family_checkpoints["bloom"]), positions=10, window=3)
    p = result.profiles[0]  # (H, 19); ALiBi: content constant - m_h |k|
    slopes = p[:, 9] - p[:, 8]
    np.testing.assert_allclose(p[:, 9][:, None] - p, slopes[:, None] * np.abs(np.arange(-9, 10)), atol=1e-9)
    assert np.all(slopes > 0)


def test_fit_tisa_on_a_rotary_model(family_checkpoints, tmp_path):
    record = run_json(["fit-tisa", str(family_checkpoints["llama"]), "--kernels", "2", "--window", "6",
                       "--out", str(tmp_path), "--json"])  # fmt: skip
    assert record["causal"] is True and record["mode"] == "content-free" and len(record["heads"]) == 2 * 4
    assert np.isfinite([h["r2"] for h in record["heads"]]).all()


def test_compare_mixes_families(family_checkpoints, tiny_checkpoints, tmp_path):
    record = run_json(["compare", str(tiny_checkpoints["bert"]), str(family_checkpoints["llama"]),
                       "--positions", "32", "--out", str(tmp_path), "--json"])  # fmt: skip
    bert, llama = record["models"]
    assert bert["position_kind"] == "learned" and bert["toeplitz_r2"] is not None and bert["n_positions"] == 32
    assert llama["position_kind"] == "rotary" and llama["toeplitz_r2"] is None and llama["causal"] is True
    assert llama["mean_fhat_r2"] is None and llama["toeplitz_by_construction"] is True  # rotary: R² = 1 by construction
    assert bert["mean_fhat_r2"] is not None and bert["toeplitz_by_construction"] is False


def test_toeplitz_names_the_commands_for_a_rotary_model(family_checkpoints, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["toeplitz", str(family_checkpoints["llama"]), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "rotary" in err and "posprobe profiles" in err
    assert not (tmp_path / "o").exists()


def test_bad_positions_and_stack(family_checkpoints):
    with pytest.raises(ArgumentValueError, match="65 positions"):
        posprobe.fhat(str(family_checkpoints["llama"]), positions=65)
    with pytest.raises(ArgumentValueError, match="one stack, no decoder"):
        posprobe.profiles(str(family_checkpoints["llama"]), stack="decoder")
    with pytest.raises(ArgumentValueError):
        posprobe.fhat(str(family_checkpoints["llama"]), positions=1)


def test_loaded_model_object_equals_folder(family_checkpoints):
    import transformers as tf

    model = tf.AutoModel.from_pretrained(family_checkpoints["gpt_neox"], dtype="float64")
    a = posprobe.fhat(model, layer=1, positions=8).matrices
    b = posprobe.fhat(str(family_checkpoints["gpt_neox"]), layer=1, positions=8).matrices
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_rotary_config_disagreeing_with_weights_is_refused(family_checkpoints, tmp_path, capsys):
    import shutil

    folder = tmp_path / "mixed"
    shutil.copytree(family_checkpoints["llama"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] = 128
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as info:
        main(["profiles", str(folder), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "vocab_size = 128 but the weights hold a word table of 99 rows" in err
    assert "re-download it" in err and not (tmp_path / "o").exists()


def test_layer_kinds_in_json_and_titles(tmp_path):
    """Local and global layers with their own rotary settings (Gemma 3): each layer's kind in `profiles` and `fhat`
    JSON and in the figure titles; a model of one kind says 'global'."""
    folder = tmp_path / "gemma3"
    build("gemma3_text").save_pretrained(folder)
    record = run_json(["profiles", str(folder), "--layers", "all", "--positions", "16", "--window", "4",
                       "--out", str(tmp_path / "p"), "--json"])  # fmt: skip
    assert record["layer_kinds"] == ["local |k| <= 4, rope theta 100", "global, linear rope theta 10000"]
    fhat = run_json(["fhat", str(folder), "--layer", "0", "--positions", "16", "--out", str(tmp_path / "f"),
                     "--json"])  # fmt: skip
    assert fhat["layer_kind"] == "local |k| <= 4, rope theta 100"
    result = posprobe.profiles(str(folder), positions=16, window=4)
    assert "local |k| <= 4" in result.plot(0)._suptitle.get_text()
    assert "(global, linear rope theta 10000)" in result.plot(1)._suptitle.get_text()
    assert "local |k| <= 4" in posprobe.fhat(str(folder), positions=16).plot().title
    plain = posprobe.profiles(str(build_llama(tmp_path)), positions=16, window=4)
    assert plain.layer_kinds == ["global", "global"] and "global" not in plain.plot(0)._suptitle.get_text()
    with np.load(record["npz"], allow_pickle=False) as npz:  # the .npz carries them in its metadata
        assert json.loads(str(npz["metadata"]))["layer_kinds"] == record["layer_kinds"]


def build_llama(tmp_path):
    folder = tmp_path / "llama"
    build("llama").save_pretrained(folder)
    return folder


def _sweep():
    from family_models import CASES

    quick = {"opt"}  # an offset (MobileBERT: paper mode through a folded bottleneck, SqueezeBERT: grouped convs: slow)
    return [pytest.param(n, marks=() if n in quick else pytest.mark.slow) for n in sorted(CASES)]


@pytest.mark.parametrize("name", _sweep())
def test_profiles_of_every_layer_are_finite(name, tmp_path):
    """Issue 22's 'done when': `posprobe profiles DIR --layers all` gives finite profiles for every family (as
    saved: float64 weights), in its default mode, with one layer kind per layer."""
    folder = tmp_path / "model"
    build(name).save_pretrained(folder)
    record = run_json(["profiles", str(folder), "--layers", "all", "--positions", "16", "--window", "4",
                       "--out", str(tmp_path / "out"), "--json"])  # fmt: skip
    scored = np.array(["no positional score" not in kind for kind in record["layer_kinds"]])  # a hybrid's others
    with np.load(record["npz"]) as npz:
        listed = np.zeros(npz["profiles"].shape[:2], dtype=bool)  # the heads the JSON lists: each layer's own
        listed[[h["layer"] for h in record["heads"]], [h["head"] for h in record["heads"]]] = True
        assert np.isfinite(npz["profiles"][listed & scored[:, None]]).all() and npz["profiles"].shape[-1] == 31
        assert np.isnan(npz["profiles"][~listed]).all()  # a head its layer does not have (Laguna): NaN, not listed
        assert np.isnan(npz["profiles"][~scored]).all() and scored.any()
    assert len(record["layer_kinds"]) == len(record["layers"]) == record["n_layers"]


@pytest.mark.slow  # every command on a tiny model: 3-4 s
def test_a_query_head_count_per_layer_through_every_command(tmp_path, capsys):
    """Laguna (2 query heads in layers 0 and 2, 4 in layers 1 and 3; SPEC §9): F̂ and profiles hold 4 heads per
    layer, a layer's missing heads NaN and left out of the JSON, named in the text table and figures; fit-tisa fits
    each layer's own heads; rotary bands read layers of one head count; states reads every layer; attention on text
    gives each layer's own heads (the others NaN, left out of the JSON), which fit-tisa fits; a model with one head
    count is unchanged (every head listed)."""
    import torch
    from tiny_tokenizer import word_tokenizer

    folder = tmp_path / "laguna"
    build("laguna", torch.float32).save_pretrained(folder)  # float32: its grouped experts take no float64 on text
    word_tokenizer(60).save_pretrained(folder)
    texts = tmp_path / "texts.txt"
    rng = np.random.default_rng(3)
    texts.write_text("".join(" ".join(f"w{x}" for x in rng.integers(0, 60, 8)) + "\n" for _ in range(6)))
    fhat = run_json(["fhat", str(folder), "--layer", "0", "--positions", "16", "--out", str(tmp_path / "f"), "--json"])
    assert [h["head"] for h in fhat["heads"]] == [0, 1]
    matrices = posprobe.fhat(str(folder), layer=0, positions=16).matrices
    assert matrices.shape == (4, 16, 16) and np.isnan(matrices[2:]).all() and np.isfinite(matrices[:2]).all()
    record = run_json(["profiles", str(folder), "--layers", "all", "--positions", "12", "--window", "4",
                       "--out", str(tmp_path / "p"), "--json"])  # fmt: skip
    own = [(layer, h) for layer, heads in enumerate([2, 4, 2, 4]) for h in range(heads)]
    assert [(h["layer"], h["head"]) for h in record["heads"]] == own
    assert all(np.isfinite(h["profile_window"]).all() for h in record["heads"])
    capsys.readouterr()
    main(["profiles", str(folder), "--layers", "all", "--positions", "12", "--out", str(tmp_path / "p2")])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1] in "0123"]
    assert rows[0][-2:] == ["—", "—"] and "—" not in rows[1]
    fit = run_json(["fit-tisa", str(folder), "--kernels", "1", "--window", "6", "--out", str(tmp_path / "t"), "--json"])
    assert len(fit["heads"]) == 12 and np.isfinite([h["r2"] for h in fit["heads"]]).all()
    from posprobe.formats.tisa_kernels import load_tisa_kernels

    a, _, _, metadata = load_tisa_kernels(fit["kernels_file"])
    assert np.isnan(a[[0, 2], 2:]).all() and np.isfinite(a[[1, 3]]).all() and np.isfinite(a[[0, 2], :2]).all()
    from posprobe.errors import PosprobeError
    from posprobe.mechanisms.catalogue import check_settings

    with pytest.raises(PosprobeError, match="a query-head count per layer"):  # no kernels to install there
        check_settings("tisa", init=f"fit:{fit['kernels_file']}")
    for layers, heads in (("0,2", 2), ("1,3", 4)):  # one layer type: one head count, one rotated width
        for extra in ([], ["--text", str(texts), "--max-length", "12"]):
            bands = run_json(["rotary", str(folder), "--layers", layers, *extra, "--out", str(tmp_path / "r"),
                              "--json"])  # fmt: skip
            with np.load(bands["npz"]) as npz:
                assert npz["q_band_norm"].shape[1] == heads and np.isfinite(npz["q_band_norm"]).all()
    mixed = runner.invoke(app, ["rotary", str(folder), "--layers", "0,1", "--out", str(tmp_path / "r2")])
    assert "(query heads, head size, key heads) [(2, 8, 2), (4, 8, 2)]" in str(mixed.exception)
    states = runner.invoke(app, ["states", str(folder), "--text", str(texts), "--max-length", "12", "--min-texts",
                                 "2", "--out", str(tmp_path / "s")])  # fmt: skip
    assert states.exit_code == 0, states.output
    attention = run_json(["attention", str(folder), "--text", str(texts), "--max-length", "12", "--min-pairs", "1",
                          "--out", str(tmp_path / "a"), "--json"])  # fmt: skip
    assert [len(row) for row in attention["mean_distance"]] == [2, 4, 2, 4]  # a layer's own heads, every one finite
    assert None not in sum(attention["mean_distance"], []) and None not in sum(attention["weights_correlation"], [])
    with np.load(attention["npz"]) as npz:
        assert np.isnan(npz["mean_distance"][[0, 2], 2:]).all() and np.isfinite(npz["mean_distance"][[1, 3]]).all()
    fitted = run_json(["fit-tisa", attention["npz"], "--kernels", "1", "--out", str(tmp_path / "ta"), "--json"])
    assert len(fitted["heads"]) == 12  # the heads each layer has, none of the missing ones
    report = run_json(["report", str(folder), "--text", str(texts), "--only", "rotary", "--out", str(tmp_path / "rp"),
                       "--json"])  # fmt: skip
    rotary = report["sections"]["rotary"]  # rotary bands of layer 0's head shape: its layers 0 and 2
    assert rotary["status"] == "ok" and "--layers 0,2" in rotary["command"], rotary
