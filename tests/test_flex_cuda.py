"""FlexAttention on CUDA: every mechanism's `score_mod` against today's score-bias path, forward and backward,
in float32 and bfloat16 (skipped without a CUDA device; CPU runs check the forward only, in test_flex.py).

Both paths are measured against one float64 reference (today's path in float64): the flex path passes when its
error is no larger than twice today's path's error at the same precision, or below a floor of a few units in the
last place of that precision. The errors are written to `$POSPROBE_FLEX_REPORT` (JSON) when it is set, for
benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (FlexAttention on GPU)")

MECHANISMS = ["tisa", "fixed", "dynamic", "key-dynamic", "composite", "tisa+fixed"]
FLOOR = {torch.float32: 2e-5, torch.bfloat16: 2e-2}  # relative; float32 floor allows TF32-free kernel reordering
_REPORT: list[dict] = []


def _model(name: str):
    import transformers as tf

    from posprobe.retrofitting.install import retrofit

    torch.manual_seed(0)
    config = tf.BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        vocab_size=99,
        max_position_embeddings=64,
        attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
        attn_implementation="sdpa",
    )
    return retrofit(tf.BertModel(config), name, radius=3, init="random", seed=1)


def _run(model, ids, mask, weight, flex_on: bool):
    """Output `(B, n, d)` at real tokens, and every parameter's gradient of a fixed quadratic loss."""
    import posprobe.mechanisms.flex as flex

    flex.FLEX_DEVICES.clear()
    if flex_on:
        flex.FLEX_DEVICES.add("cuda")
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    loss = (out[keep].double() * weight).pow(2).sum()
    loss.backward()
    grads = {n: p.grad.detach().double().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out[keep].detach().double(), grads


def _relative_error(a: torch.Tensor, ref: torch.Tensor, scale: float = 0.0) -> float:
    """max |a - ref| over max |ref| (at least `scale`: a gradient that is zero in the reference is measured
    against the largest gradient of the model, not against zero)."""
    return float((a - ref).abs().max() / max(float(ref.abs().max()), scale, 1e-30))


def _grad_error(grads: dict, reference: dict) -> float:
    scale = 1e-3 * max(float(g.abs().max()) for g in reference.values())
    return max(_relative_error(grads[n], g, scale) for n, g in reference.items())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", MECHANISMS)
def test_flex_equals_the_bias_path_forward_and_backward(name, dtype, monkeypatch):
    import posprobe.mechanisms.flex as flex

    monkeypatch.setattr(flex, "FLEX_DEVICES", set())
    monkeypatch.setattr(flex, "_disabled", [])
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    base = _model(name).train()  # train mode with dropout 0: the flex path's condition, and gradients
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 99, (3, 37), generator=gen).cuda()  # 37: not a multiple of FlexAttention's block
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    mask[2, 11:] = 0
    weight = torch.randn(64, generator=gen, dtype=torch.float64).cuda()

    reference = _run(base.double().cuda(), ids, mask, weight, flex_on=False)
    model = base.to(dtype)
    calls = []
    original = flex.flex_attention
    monkeypatch.setattr(flex, "flex_attention", lambda *a, **k: calls.append(1) or original(*a, **k))
    today = _run(model, ids, mask, weight, flex_on=False)
    assert not calls
    flexed = _run(model, ids, mask, weight, flex_on=True)
    assert len(calls) == model.config.num_hidden_layers and not flex._disabled, flex._disabled

    errors = {}
    for label, (out, grads) in (("today", today), ("flex", flexed)):
        errors[label] = {
            "output": _relative_error(out, reference[0]),
            "grad": _grad_error(grads, reference[1]),
        }
    assert set(flexed[1]) == set(reference[1])  # the flex path gives every parameter its gradient
    row = {"mechanism": name, "dtype": str(dtype).removeprefix("torch."), **errors}
    _REPORT.append(row)
    if os.environ.get("POSPROBE_FLEX_REPORT"):
        with open(os.environ["POSPROBE_FLEX_REPORT"], "w") as fh:
            json.dump(_REPORT, fh, indent=1)
    for part in ("output", "grad"):
        bound = max(2 * errors["today"][part], FLOOR[dtype])
        assert errors["flex"][part] <= bound, (part, errors)
