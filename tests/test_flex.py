"""FlexAttention `score_mod`s: the same scores as each mechanism's `score_bias` (called on index grids), and
the same attention output through `flex_attention` on CPU (forward only: FlexAttention has no CPU backward)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import build_tiny

from posprobe.mechanisms import REGISTRY
from posprobe.mechanisms.catalogue import LayerShape, combined_info, mechanism_info
from posprobe.retrofitting.install import retrofit

BIAS_MECHANISMS = ["tisa", "fixed", "dynamic", "key-dynamic", "composite"]


def _mechanism(name: str, radius: int = 3):
    torch.manual_seed(0)
    shape = LayerShape(num_heads=3, head_dim=4, input_size=12)
    if "+" in name:
        from posprobe.mechanisms.combined import CombinedMechanism

        info = combined_info(name)
        mech = CombinedMechanism(shape, info.options(radius=radius, kernels=2))
    else:
        info = mechanism_info(name)
        mech = REGISTRY[name](shape, info.options(radius=radius, kernels=2))
    mech.reset("random", torch.Generator().manual_seed(1))
    return mech.double()


def _grid_scores(mod, B: int, H: int, n_q: int, n_k: int) -> torch.Tensor:
    """`mod(0, b, h, q_idx, kv_idx)` on broadcast index grids: `(B, H, n_q, n_k)`."""
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    q = torch.arange(n_q).view(1, 1, n_q, 1)
    kv = torch.arange(n_k).view(1, 1, 1, n_k)
    return mod(torch.zeros((), dtype=torch.float64), b, h, q, kv).expand(B, H, n_q, n_k)


@pytest.mark.parametrize("name", [*BIAS_MECHANISMS, "tisa+fixed", "fixed+shaw-values"])
@pytest.mark.parametrize(("n_q", "n_k"), [(7, 7), (5, 9), (12, 12)])
def test_score_mod_equals_score_bias_on_index_grids(name, n_q, n_k):
    mech = _mechanism(name)
    query = torch.randn(2, 3, n_q, 4, dtype=torch.float64)
    key = torch.randn(2, 3, n_k, 4, dtype=torch.float64)
    bias = mech.score_bias(query, key).expand(2, 3, n_q, n_k)
    mod = mech.score_mod(query, key)
    assert mod is not None
    torch.testing.assert_close(_grid_scores(mod, 2, 3, n_q, n_k), bias, rtol=0, atol=1e-12)


def test_mechanisms_without_a_score_bias_have_no_score_mod():
    for name in ("cat", "depthwise", "shaw-values", "cat+depthwise"):
        mech = _mechanism(name)
        q = torch.randn(1, 3, 5, 4, dtype=torch.float64)
        assert mech.score_mod(q, q) is None


@pytest.mark.parametrize("name", BIAS_MECHANISMS)
def test_flex_attention_on_cpu_matches_todays_path(name, monkeypatch):
    """A retrofitted tiny BERT (eval, padded batch): the flex path (forced on for CPU) gives today's outputs."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    import posprobe.mechanisms.flex as flex

    model = retrofit(build_tiny("bert"), name, radius=3, init="random").eval()
    ids = torch.randint(5, 99, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    with torch.no_grad():
        today = model(ids, attention_mask=mask)[0]
    calls = []
    original = flex.flex_attention
    monkeypatch.setattr(flex, "flex_attention", lambda *a, **k: calls.append(1) or original(*a, **k))
    monkeypatch.setattr(flex, "FLEX_DEVICES", {"cuda", "cpu"})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*without torch.compile")  # eager flex on CPU (warned once)
        flexed = model(ids, attention_mask=mask)[0]
    assert len(calls) == model.config.num_hidden_layers and not flex._disabled
    keep = mask.bool()
    torch.testing.assert_close(flexed[keep], today[keep], rtol=1e-5, atol=1e-5)


def test_flex_is_not_used_with_attention_dropout_or_on_cpu_by_default(monkeypatch):
    import posprobe.mechanisms.flex as flex

    mech = _mechanism("fixed")
    q = torch.randn(1, 3, 5, 4)
    assert not flex.use_flex(q, mech, 0.0, False)  # CPU is not in FLEX_DEVICES
    monkeypatch.setattr(flex, "FLEX_DEVICES", {"cpu"})
    assert flex.use_flex(q, mech, 0.0, False)
    assert not flex.use_flex(q, mech, 0.1, False)  # FlexAttention has no attention dropout
    assert not flex.use_flex(q, mech, 0.0, True)  # output_attentions needs the probabilities
    assert not flex.use_flex(q, _mechanism("shaw-values"), 0.0, False)


def test_a_failing_flex_falls_back_to_todays_path_once(monkeypatch):
    import posprobe.mechanisms.flex as flex

    model = retrofit(build_tiny("bert"), "tisa", radius=3, init="random").eval()
    ids = torch.randint(5, 99, (2, 6))
    with torch.no_grad():
        today = model(ids)[0]

    def broken():
        def run(*args, **kwargs):
            raise RuntimeError("no kernel for this device")

        return run

    monkeypatch.setattr(flex, "_compiled", broken)
    monkeypatch.setattr(flex, "_disabled", [])
    monkeypatch.setattr(flex, "FLEX_DEVICES", {"cpu"})
    with torch.no_grad(), pytest.warns(UserWarning, match="FlexAttention failed .*no kernel"):
        again = model(ids)[0]
    assert flex._disabled and not flex.flex_available()
    torch.testing.assert_close(again, today)
