"""A notebook session, written as a test: every capability reached through `import posprobe` alone, on a tiny model.

load -> toeplitz / fhat / profiles -> TISA fit -> plots -> retrofit every mechanism -> save / load round trip.
(Fine-tuning is covered by tests/test_finetune.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_tiny

import posprobe

MECHANISMS = ["cat", "composite", "conv-qkv", "depthwise", "dynamic", "fixed", "key-dynamic", "shaw-values", "tisa"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("notebook") / "tiny-bert"
    build_tiny("bert").save_pretrained(path)
    return path


@pytest.mark.slow  # every capability in one session: each is tested on its own in the default run
def test_a_notebook_session(folder, tmp_path):
    import torch
    from matplotlib.figure import Figure

    model = posprobe.load_model(folder).eval()  # a transformers model
    ids = torch.tensor([[2, 5, 7, 11, 13, 3]])

    t = posprobe.toeplitz(model)
    assert t.matrix.shape == (64, 64) and 0 < t.toeplitz_r2 < 1
    assert t.toeplitz_r2 == posprobe.toeplitz(folder).toeplitz_r2  # the object and its folder agree
    f = posprobe.fhat(model, layer=-1, mode="faithful")
    assert f.matrices.shape == (4, 64, 64) and f.toeplitz_r2.shape == (4,)
    p = posprobe.profiles(model, layers=[1], window=6)
    assert p.profiles.shape == (1, 4, 127) and p.offsets[0] == -63

    fitter = posprobe.TisaKernelFitter(n_kernels=2, window=10).fit(p)
    assert fitter.a_.shape == (1, 4, 2) and 0 <= fitter.score(p) <= 1
    fit = posprobe.fit_tisa(model, kernels=2, window=10).save(tmp_path / "fit")
    kernels_file = fit.fits[0].kernels_file
    a, _, _, meta = posprobe.load_tisa_kernels(kernels_file)
    assert a.shape == (2, 4, 2) and meta["n_kernels"] == 2

    for result in (t, f, p, fit):
        figure = result.plot()
        assert isinstance(figure, Figure) or hasattr(figure, "_repr_png_")
        figure.savefig(tmp_path / f"{type(result).__name__}.png")
        assert "\n" not in repr(result)

    with torch.no_grad():
        plain = model(ids).last_hidden_state
    assert sorted(posprobe.mechanisms.REGISTRY) == MECHANISMS
    for name in MECHANISMS:
        fresh = posprobe.load_model(folder).eval()
        init = f"fit:{kernels_file}" if name == "tisa" else "zero"
        fitted = posprobe.retrofit(fresh, name, radius=2, init=init)
        with torch.no_grad():
            out = fitted(ids).last_hidden_state
        assert torch.isfinite(out).all(), name
        if name != "tisa":  # zero init leaves the outputs unchanged
            torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5, msg=name)
        saved = posprobe.save_retrofitted(fitted, tmp_path / name)
        again = posprobe.load_model(saved).eval()
        with torch.no_grad():
            assert torch.equal(again(ids).last_hidden_state, out), name
        posprobe.toeplitz(again)  # a retrofitted model in memory is analysed like any other

    with pytest.raises(posprobe.PosprobeError):
        posprobe.fhat(model, layer=5)
    np.testing.assert_array_equal(posprobe.fhat(model, layer=1).matrices, posprobe.fhat(folder, layer=1).matrices)
