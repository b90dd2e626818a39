"""One shared suite for every registered positional mechanism (registering a mechanism enrols it here).

Checks, per mechanism: efficient hooks == the mechanism's naive per-pair loop reference (forward and
gradients, float64, with padding and clipping exercised); zero/identity init leaves every supported model
family unchanged; padded and unpadded batches agree; save/load round trip is exact; with the position
embeddings dropped the model runs at twice `max_position_embeddings`.
"""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny

from posprobe.mechanisms import CATALOGUE, MECHANISM_NAMES, REGISTRY, ROLES, LayerShape
from posprobe.retrofitting.install import (
    added_parameters,
    expected_parameters,
    mechanism_at,
    retrofit,
    save_retrofitted,
)
from posprobe.retrofitting.loading import load_model

MECHANISMS = sorted(REGISTRY)
FAMILIES = ["bert", "roberta", "xlm-roberta", "albert", "electra"]


def _ids(batch: int, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, 99, (batch, n), generator=g)


def _out(model, ids, mask=None) -> torch.Tensor:
    return model(input_ids=ids, attention_mask=mask)[0]


def test_registry_is_the_catalogue():
    """Every catalogue entry has its torch class registered under the same name, and nothing else is."""
    assert list(REGISTRY) == list(MECHANISM_NAMES) == list(CATALOGUE)
    for name, cls in REGISTRY.items():
        assert cls.name == name and cls.info is CATALOGUE[name] and cls.summary == CATALOGUE[name].summary


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize(
    "heads, head_dim, width, radius, kernels", [(4, 8, 32, 3, 2), (5, 6, 24, 1, 1), (12, 64, 768, 8, 5)]
)
def test_catalogue_count_equals_real_parameters(name, heads, head_dim, width, radius, kernels):
    """The torch-free count per depth (used by `params` and `retrofit --json`) == the module's parameters."""
    info = CATALOGUE[name]
    shape = LayerShape(num_heads=heads, head_dim=head_dim, input_size=width)
    options = info.options(radius=radius, kernels=kernels)
    mech = REGISTRY[name](shape, options)
    assert info.parameters_per_depth(shape, options) == sum(p.numel() for p in mech.parameters())


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_catalogue_count_equals_added_parameters_of_a_model(family):
    for name in MECHANISMS:
        model = retrofit(build_tiny(family, num_hidden_layers=3), name, radius=2, kernels=2)
        assert expected_parameters(model) == added_parameters(model) > 0, name


@pytest.mark.parametrize("name", MECHANISMS)
def test_efficient_equals_naive_reference(name):
    """Layer-level: the attention module with hooks vs loops over (b, h, i, j); forward and gradients."""
    model = build_tiny("bert").double()
    retrofit(model, name, radius=2, kernels=3, init="random", seed=1)  # r=2 < n: clipping is exercised
    attention, _ = model.encoder.layer[0].attention.self, None
    mech = mechanism_at(model, 0)
    B, n, d = 2, 7, 32
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, n, d, generator=g, dtype=torch.float64, requires_grad=True)
    valid = torch.ones(B, n, dtype=torch.bool)
    valid[1, 5:] = False
    mask = valid[:, None, None, :].expand(B, 1, n, n)
    weight = torch.randn(B, n, d, generator=g, dtype=torch.float64) * valid[:, :, None]

    params = [p for p in mech.parameters()] + [x]
    fast = attention(x, attention_mask=mask)[0]
    grads_fast = torch.autograd.grad((fast * weight).sum(), params)
    slow = mech.naive_self_attention(x, {r: getattr(attention, r) for r in ROLES}, valid)
    grads_slow = torch.autograd.grad((slow * weight).sum(), params)

    torch.testing.assert_close(fast[valid], slow[valid], rtol=1e-10, atol=1e-10)
    for gf, gs in zip(grads_fast, grads_slow):
        torch.testing.assert_close(gf, gs, rtol=1e-9, atol=1e-10)
    assert any(gf.abs().sum() > 0 for gf in grads_fast[:-1]), "mechanism parameters receive no gradient"


# BERT and ALBERT (factorised embeddings) in the default run; RoBERTa, XLM-R and ELECTRA in the slow tier (CI)
@pytest.mark.parametrize(
    "family", [f if f in ("bert", "albert") else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES]
)
@pytest.mark.parametrize("name", MECHANISMS)
def test_zero_init_is_identity(name, family):
    base = build_tiny(family).double()
    ids = _ids(2, 9)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        ref_full, ref_pad = _out(base, ids), _out(base, ids, mask)
        retrofit(base, name, init="zero")
        new_full, new_pad = _out(base, ids), _out(base, ids, mask)
    torch.testing.assert_close(new_full, ref_full, rtol=0, atol=1e-12)
    keep = mask.bool()
    torch.testing.assert_close(new_pad[keep], ref_pad[keep], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("family", ["bert", "albert"])
def test_padding_never_changes_real_tokens(name, family):
    model = retrofit(build_tiny(family).double(), name, radius=3, init="random", seed=2)
    ids = _ids(2, 10, seed=5)
    lengths = [10, 6]
    mask = torch.zeros_like(ids)
    for b, length in enumerate(lengths):
        mask[b, :length] = 1
    padded = ids.clone()
    padded[1, 6:] = 0
    with torch.no_grad():
        batch = _out(model, padded, mask)
        for b, length in enumerate(lengths):
            alone = _out(model, ids[b : b + 1, :length])
            torch.testing.assert_close(batch[b, :length], alone[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", MECHANISMS)
def test_save_load_round_trip(name, tmp_path):
    model = retrofit(build_tiny("albert"), name, radius=3, kernels=2, init="random", seed=4)
    ids = _ids(2, 12)
    with torch.no_grad():
        before = _out(model, ids)
    save_retrofitted(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m").eval()
    assert loaded.config.posprobe["mechanism"] == name
    with torch.no_grad():
        after = _out(loaded, ids)
    assert torch.equal(before, after)


@pytest.mark.parametrize("name", MECHANISMS)
def test_relative_only_runs_beyond_max_positions(name):
    model = retrofit(build_tiny("bert"), name, radius=4, init="random", drop_position_embeddings=True)
    n = 2 * model.config.max_position_embeddings
    ids = _ids(2, n)
    mask = torch.ones_like(ids)
    mask[1, n // 2 :] = 0
    with torch.no_grad():
        out = _out(model, ids, mask)
    assert out.shape[:2] == (2, n) and torch.isfinite(out).all()
