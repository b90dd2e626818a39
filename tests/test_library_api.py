"""posprobe as a library (issue 15): top-level names, models in memory, notebook-friendly results, arguments
checked at the API boundary with library wording, quiet analyses, and the scikit-learn contract of the fitter."""

from __future__ import annotations

import inspect
import json
import os
import pydoc
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import FAMILIES, build_tiny
from typer.testing import CliRunner

import posprobe
from posprobe.errors import ArgumentTypeError, ArgumentValueError, PosprobeError

ROOT = Path(__file__).resolve().parents[1]
RESULT_ARRAY = {"ToeplitzResult": "matrix", "FhatResult": "matrices", "ProfileResult": "profiles"}


# ------------------------------------------------------------------------------------- top-level names
def test_import_is_light_and_exports_everything():
    code = (
        "import sys, posprobe; heavy = [m for m in ('torch', 'transformers', 'matplotlib', 'typer', 'rich') "
        "if m in sys.modules]; print(heavy); print(sorted(posprobe.__all__))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    heavy, names = out.splitlines()
    assert heavy == "[]"
    for name in ("toeplitz", "fhat", "profiles", "compare", "fit_tisa", "TisaKernelFitter", "retrofit", "load_model"):
        assert name in names
    for name in ("save_retrofitted", "finetune", "ToeplitzResult", "FhatResult", "ProfileResult", "PosprobeError"):
        assert name in names


def test_every_exported_name_resolves():
    for name in posprobe.__all__:
        assert getattr(posprobe, name) is not None, name
    assert set(posprobe.__all__) <= set(dir(posprobe))
    assert not hasattr(posprobe, "toeplitz_analysis")  # one name per function (the long aliases went at 0.1.0)
    assert posprobe.PosprobeError is PosprobeError
    assert posprobe.plotting.base.heatmap and posprobe.analysis.toeplitz.toeplitz_r2  # subpackages without an import


def test_load_model_and_retrofit_show_their_real_signatures():
    params = inspect.signature(posprobe.load_model).parameters
    assert list(params)[:2] == ["path_or_id", "model_class"] and "allow_pickle" in params
    assert "path_or_id" in pydoc.render_doc(posprobe.load_model)
    assert "mechanism" in inspect.signature(posprobe.retrofit).parameters
    import posprobe.retrofitting.install as module  # the module has its own name: posprobe.retrofit stays the function

    assert posprobe.retrofit is module.retrofit and posprobe.retrofit.__name__ == "retrofit"


# ------------------------------------------------------------------------------------- models in memory
@pytest.mark.parametrize("family", FAMILIES + ["bert-classifier"])
def test_in_memory_results_equal_folder_results_exactly(family, tiny_checkpoints, tmp_path):
    if family == "bert-classifier":  # a task-head model: every tensor name carries the 'bert.' prefix
        import transformers as tf

        model = tf.BertForSequenceClassification(build_tiny("bert").config).eval()
        folder = tmp_path / "clf"
        model.save_pretrained(folder)
        assert any(k.startswith("bert.embeddings.") for k in model.state_dict())
    else:
        model, folder = build_tiny(family), tiny_checkpoints[family]
    for analysis, kwargs in (
        (posprobe.toeplitz, dict(blocks=[16])),
        (posprobe.toeplitz, dict(cosine=True)),
        (posprobe.fhat, dict(layer=-1, mode="faithful")),
        (posprobe.fhat, dict(layer=0, mode="paper")),
        (posprobe.profiles, dict(window=4)),
    ):
        memory, files = analysis(model, **kwargs), analysis(str(folder), **kwargs)
        array = RESULT_ARRAY[type(memory).__name__]
        np.testing.assert_array_equal(getattr(memory, array), getattr(files, array))
        a, b = memory.to_dict(), files.to_dict()
        a.pop("model"), b.pop("model")
        assert a == b
    assert posprobe.fit_tisa(model, kernels=2, layers=[0]).fits[0].a.shape == (1, 4, 2)
    rows = posprobe.compare([model, str(folder)])
    assert rows[0].toeplitz_r2 == rows[1].toeplitz_r2 and rows[0].mean_fhat_r2 == rows[1].mean_fhat_r2


def test_in_memory_model_is_not_modified(tiny_models):
    model = tiny_models["bert"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = posprobe.fhat(model)
    result.matrices[:] = 0  # the result's arrays are copies
    for k, v in model.state_dict().items():
        assert v.equal(before[k])


# ------------------------------------------------------------------------------------- results in a notebook
def test_reprs_are_short(tiny_checkpoints):
    folder = str(tiny_checkpoints["bert"])
    results = [
        posprobe.toeplitz(folder),
        posprobe.fhat(folder),
        posprobe.profiles(folder, window=4),
        posprobe.compare([folder, str(tiny_checkpoints["gpt2"])]),
        posprobe.fit_tisa(folder, kernels=[1, 2], layers=[0]),
    ]
    for result in results:
        text = repr(result)
        assert "\n" not in text and len(text) < 300, text
    assert "matrix=<array 64x64>" in repr(results[0])


def test_plot_on_every_result_returns_a_figure(tiny_checkpoints):
    from matplotlib.figure import Figure

    folder = str(tiny_checkpoints["bert"])
    results = [
        posprobe.toeplitz(folder),
        posprobe.fhat(folder),
        posprobe.profiles(folder, window=4),
        posprobe.compare([folder, str(tiny_checkpoints["gpt2"])]),
        posprobe.fit_tisa(folder, kernels=1, layers=[0]),
    ]
    for result in results:
        figure = result.plot()  # a Figure, or (F_hat_P) an image mosaic that displays and saves like one
        assert isinstance(figure, Figure) or hasattr(figure, "_repr_png_"), type(result).__name__
        assert callable(figure.savefig)


def test_profiles_plot_layer_means_the_model_layer(tiny_checkpoints):
    result = posprobe.profiles(str(tiny_checkpoints["bert"]), layers=[1], window=4)
    figure = result.plot(layer=1)
    assert "layer 1" in figure._suptitle.get_text()
    assert "layer 1" in result.plot()._suptitle.get_text()
    assert result.plot(layer=-1)._suptitle.get_text() == figure._suptitle.get_text()  # -1 = the model's last
    np.testing.assert_array_equal(result.profile(1, 2), result.profiles[0, 2])
    with pytest.raises(ArgumentValueError, match="layer 0 was not computed"):
        result.plot(layer=0)


def _cli_json(args):
    from posprobe.cli import app

    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


@pytest.mark.slow
def test_to_dict_equals_the_cli_json_minus_paths(tiny_checkpoints, tmp_path):
    folder = str(tiny_checkpoints["roberta"])
    paths = ("figure", "record", "figures", "npz")
    cases = [
        (["toeplitz", folder, "--block", "16"], posprobe.toeplitz(folder, blocks=[16])),
        (["toeplitz", folder], posprobe.toeplitz(folder)),
        (["fhat", folder, "--layer", "1", "--mode", "faithful"], posprobe.fhat(folder, layer=1, mode="faithful")),
        (["profiles", folder, "--layers", "0", "--window", "5"], posprobe.profiles(folder, layers=[0], window=5)),
        (["compare", folder, str(tiny_checkpoints["bert"])], posprobe.compare([folder, str(tiny_checkpoints["bert"])])),
    ]
    for i, (args, result) in enumerate(cases):
        record = _cli_json(args + ["--out", str(tmp_path / str(i)), "--json"])
        assert {k: v for k, v in record.items() if k not in paths} == result.to_dict(), args
        assert json.loads(result.to_json()) == result.to_dict()


def test_default_block_that_does_not_fit_is_listed_not_dropped(tiny_checkpoints):
    result = posprobe.toeplitz(str(tiny_checkpoints["bert"]))  # 64 positions: the default 128 does not fit
    assert result.blocks == {} and result.skipped_blocks == (128,)
    assert result.to_dict()["skipped_blocks"] == [128]
    assert posprobe.toeplitz(None).blocks.keys() == {128}


@pytest.mark.parametrize("rows", [0, 1])
def test_a_position_table_of_fewer_than_two_rows_is_refused(rows, tmp_path):
    import torch

    model = build_tiny("bert")
    table = model.embeddings.position_embeddings
    table.weight = torch.nn.Parameter(table.weight[:rows].detach().clone())
    model.save_pretrained(tmp_path)
    for analysis in (posprobe.toeplitz, posprobe.fhat, posprobe.profiles):
        for where in (model, str(tmp_path)):  # in memory and from the folder
            with pytest.raises(PosprobeError, match="at least 2"):
                analysis(where)


def test_constant_position_table_gives_undefined_r2_not_a_number():
    # issue 8 #3: retrofit TISA with dropped position embeddings, then analyse: R^2 is undefined, JSON null.
    model = posprobe.retrofit(build_tiny("bert"), "tisa", drop_position_embeddings=True)
    t = posprobe.toeplitz(model)
    assert t.toeplitz_r2 is None and json.loads(t.to_json())["toeplitz_r2"] is None
    f = posprobe.fhat(model)
    assert np.isnan(f.toeplitz_r2).all() and f.mean_toeplitz_r2 is None
    assert all(h["toeplitz_r2"] is None for h in json.loads(f.to_json())["heads"])
    assert isinstance(t.plot(), object) and "undefined" in t.plot().axes[0].get_title()


@pytest.mark.slow
def test_constant_position_table_through_the_cli(tmp_path):
    # the reproduction of issue 8 #3 as a user ran it: retrofit --drop-position-embeddings, save, then analyse
    model = posprobe.retrofit(build_tiny("bert"), "tisa", drop_position_embeddings=True)
    folder = posprobe.save_retrofitted(model, tmp_path / "rf")
    record = _cli_json(["toeplitz", str(folder), "--block", "16", "--out", str(tmp_path / "t"), "--json"])
    assert record["toeplitz_r2"] is None and record["blocks"] == {"16": None}
    assert json.loads((tmp_path / "t" / "P.json").read_text())["toeplitz_r2"] is None
    from posprobe.cli import app

    text = CliRunner().invoke(app, ["fhat", str(folder), "--out", str(tmp_path / "f")])
    assert text.exit_code == 0 and "undefined (constant matrix)" in text.output


# ------------------------------------------------------------------------------------- argument validation
BAD_ARGUMENTS = [
    (posprobe.toeplitz, dict(blocks=128), ArgumentTypeError, "blocks=\\[128\\]"),
    (posprobe.toeplitz, dict(blocks=[0]), ArgumentValueError, "blocks must be at least 1"),
    (posprobe.toeplitz, dict(blocks=[65]), ArgumentValueError, "block 65 does not fit"),
    (posprobe.toeplitz, dict(cosine="yes"), ArgumentTypeError, "cosine must be True or False"),
    (posprobe.toeplitz, dict(allow_pickle=1), ArgumentTypeError, "allow_pickle must be True or False"),
    (posprobe.profiles, dict(layers=3), ArgumentTypeError, "layers=\\[3\\]"),
    (posprobe.profiles, dict(layers=[0, 5]), ArgumentValueError, "layer 5 does not exist"),
    (posprobe.profiles, dict(window=0), ArgumentValueError, "window must be at least 1"),
    (posprobe.profiles, dict(window=64), ArgumentValueError, "window 64 does not fit 64 positions"),
    (posprobe.fhat, dict(layer="2"), ArgumentTypeError, "layer must be a whole number, got '2'"),
    (posprobe.fhat, dict(layer=1.5), ArgumentTypeError, "layer must be a whole number, got 1.5"),
    (posprobe.fhat, dict(layer=2), ArgumentValueError, "layers 0..1"),
    (posprobe.fhat, dict(layer=-3), ArgumentValueError, "layer -3 does not exist"),
    (posprobe.fhat, dict(mode="fast"), ArgumentValueError, "unknown mode 'fast'"),
    (posprobe.fit_tisa, dict(kernels=0), ArgumentValueError, "kernels must be at least 1"),
    (posprobe.fit_tisa, dict(kernels="5"), ArgumentTypeError, "kernels must be a list"),
    (posprobe.fit_tisa, dict(window=2.5), ArgumentTypeError, "window must be a whole number"),
]


@pytest.mark.parametrize(("analysis", "kwargs", "error", "words"), BAD_ARGUMENTS)
def test_bad_arguments_are_refused_with_library_wording(analysis, kwargs, error, words, tiny_checkpoints):
    with pytest.raises(error, match=words) as info:
        analysis(str(tiny_checkpoints["bert"]), **kwargs)
    assert isinstance(info.value, PosprobeError) and "--" not in str(info.value)


def test_bad_model_arguments():
    with pytest.raises(ArgumentTypeError, match="model must be a hub id, a folder, None or a loaded"):
        posprobe.toeplitz(123)
    with pytest.raises(ArgumentTypeError, match="models must be a list"):
        posprobe.compare("bert-base-uncased")
    with pytest.raises(ArgumentValueError, match="two or more models"):
        posprobe.compare([None])


def test_layer_minus_one_is_the_last_layer(tiny_checkpoints):
    folder = str(tiny_checkpoints["bert"])
    last = posprobe.fhat(folder, layer=-1)
    assert last.layer == 1
    np.testing.assert_array_equal(last.matrices, posprobe.fhat(folder, layer=1).matrices)
    assert posprobe.profiles(folder, layers=[-1, 0], window=4).layers == [1, 0]


def test_the_cli_words_the_same_errors_as_flags(tiny_checkpoints, tmp_path, capsys):
    from posprobe.cli import main

    with pytest.raises(SystemExit) as info:
        main(["toeplitz", str(tiny_checkpoints["bert"]), "--block", "65", "--out", str(tmp_path / "o")])
    assert info.value.code == 2 and "--block between 1 and 64" in capsys.readouterr().err


def test_analyses_are_quiet(tiny_checkpoints, capfd):
    folder = str(tiny_checkpoints["albert"])
    posprobe.toeplitz(folder), posprobe.fhat(folder), posprobe.profiles(folder, window=3)
    posprobe.fit_tisa(folder, kernels=1, layers=[0])
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


# ------------------------------------------------------------------------------------- the fitter's contract
def _heads(shape=(2, 3), n=12, seed=0):
    rng = np.random.default_rng(seed)
    k = np.arange(-(n - 1), n)
    centres = rng.uniform(-3, 3, size=shape + (1,))
    return 2.0 * np.exp(-0.3 * (k - centres) ** 2) + 0.01 * rng.normal(size=shape + (k.size,)), k


def test_fitter_follows_the_estimator_contract():
    fitter = posprobe.TisaKernelFitter(n_kernels=2, window=6)
    assert repr(fitter) == "TisaKernelFitter(n_kernels=2, window=6)"
    assert repr(posprobe.TisaKernelFitter()) == "TisaKernelFitter()"
    params = fitter.get_params()
    assert params == dict(n_kernels=2, window=6, restarts=None, max_iter=None, seed=0, exhaustive=False)
    assert fitter.set_params(seed=3) is fitter and fitter.seed == 3
    with pytest.raises(ValueError, match="no parameter 'kernels'"):
        fitter.set_params(kernels=3)
    assert posprobe.TisaKernelFitter(n_kernels="x").n_kernels == "x"  # __init__ only stores
    assert not [name for name in vars(fitter) if name.endswith("_")]  # nothing learned before fit
    profiles, k = _heads()
    assert fitter.fit(profiles, k) is fitter
    assert fitter.a_.shape == (2, 3, 2) and fitter.r2_.shape == (2, 3) and len(fitter.flags_) == 2
    assert fitter.predict(k).shape == (2, 3, k.size)
    assert fitter.score(profiles, k) == pytest.approx(float(np.mean(fitter.r2_)), abs=1e-12)
    assert fitter.score(profiles, k) > 0.99


@pytest.mark.slow
def test_fitter_accepts_layer_head_profiles_as_flat_rows():
    profiles, k = _heads()
    cube = posprobe.TisaKernelFitter(2, window=6).fit(profiles, k)
    flat = posprobe.TisaKernelFitter(2, window=6).fit(profiles.reshape(6, -1), k)
    np.testing.assert_array_equal(cube.a_.reshape(6, 2), flat.a_)
    np.testing.assert_array_equal(cube.r2_.reshape(6), flat.r2_)
    centred = posprobe.TisaKernelFitter(2, window=6).fit(profiles)  # odd K: offsets centred on 0 by default
    np.testing.assert_array_equal(centred.a_, cube.a_)


def test_fitter_takes_a_profile_result(tiny_checkpoints):
    result = posprobe.profiles(str(tiny_checkpoints["bert"]), layers=[0], window=4)
    fitter = posprobe.TisaKernelFitter(1, window=8).fit(result)
    assert fitter.a_.shape == (1, 4, 1) and fitter.fit_offsets_.tolist() == list(range(-8, 9))


def test_fitter_errors_name_arguments_not_flags():
    profiles, k = _heads()
    cases = [
        (dict(n_kernels=0), "n_kernels must be at least 1"),
        (dict(n_kernels=2.0), "n_kernels must be a whole number"),
        (dict(window=0), "window must be at least 1"),
        (dict(window=100), "larger than the available offsets"),
        (dict(restarts=0), "restarts must be at least 1"),
        (dict(exhaustive="no"), "exhaustive must be True or False"),
    ]
    for kwargs, words in cases:
        with pytest.raises(PosprobeError, match=words) as info:
            posprobe.TisaKernelFitter(**kwargs).fit(profiles, k)
        assert "--" not in str(info.value) and (info.value.hint or "exhaustive" in kwargs)
    assert "--kernels" in _render_cli(posprobe.TisaKernelFitter(0), profiles, k)
    with pytest.raises(ArgumentValueError, match="offsets are needed"):
        posprobe.TisaKernelFitter(1).fit(np.zeros((2, 6)))


def _render_cli(fitter, profiles, k) -> str:
    try:
        fitter.fit(profiles, k)
    except PosprobeError as err:
        return err.render(cli=True)
    raise AssertionError("no error")


def test_fitter_clones_with_scikit_learn():
    sklearn_base = pytest.importorskip("sklearn.base")
    fitter = posprobe.TisaKernelFitter(n_kernels=3, seed=7)
    twin = sklearn_base.clone(fitter)
    assert twin is not fitter and twin.get_params() == fitter.get_params()


def test_submodules_resolve_on_first_use_whatever_was_imported_before():
    """`posprobe.plotting.base` works in a fresh process where the package was imported first (a notebook that ran
    `import posprobe.plotting`), not only when some earlier import happened to load the submodule."""
    import subprocess
    import sys

    code = (
        "import posprobe.plotting as p, posprobe.analysis as a, posprobe.formats as f\n"
        "assert p.base.heatmap and a.toeplitz.toeplitz_r2 and f.save.save\n"
        "assert not hasattr(p, 'nothing') and not hasattr(p, '_private')\n"
        "import posprobe\n"
        "assert posprobe.texts.reading and not hasattr(posprobe, 'outputs')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
