"""Edits (SPEC §20) on the packaged SmolLM2-135M-Instruct GGUF (a real rotary LLM; transformers de-quantises it and
puts its q/k rows back in the half-split pairing): each kind equals a plain transformers reference built here with
hooks, position ids and a 4D mask, on the loss by position of `posprobe context`, to 1e-4 nats; `shift:1000`
equals no edit. Slow tier (a 135M model on CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_edits import additive, attend_allowed, channel_hook, head_pre_hook, hooked, output_means, qk_pair_hook

import posprobe

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LENGTH, TOL = 96, 1e-4


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    import transformers

    from posprobe.checkpoint.loading import quiet_libraries

    with quiet_libraries():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
        )
    return model.eval()


def _docs():
    rng = np.random.default_rng(0)
    return [[int(x) for x in rng.integers(100, 20000, size=200)]]


def _loss(model, ids, **kwargs) -> np.ndarray:
    model.set_attn_implementation("eager")
    with torch.no_grad():
        logits = model(input_ids=ids, **kwargs).logits.double()
    return -torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0].mean(0).numpy()


@pytest.mark.parametrize("edit", ["band:*.0", "band:*.31", "rope-keep:0.25", "attend:4,20", "head:21.8,18.6=mean",
                                  "channel:5.100", "shift:1000"])  # fmt: skip
def test_smollm2_edits_equal_the_hooked_reference(smollm2, edit):
    model = smollm2
    docs = _docs()
    ids = torch.tensor([docs[0][:LENGTH]])
    ours = posprobe.context(model, [LENGTH], documents=docs, windows=1, edits=[edit]).position_loss[0]
    layers, d_h = model.model.layers, 64
    if edit.startswith("band"):
        f = int(edit.rsplit(".", 1)[1])
        hooks = [(getattr(layer.self_attn, p), qk_pair_hook([f, f + 32], d_h), False)
                 for layer in layers for p in ("q_proj", "k_proj")]  # fmt: skip
        with hooked(*hooks):
            reference = _loss(model, ids)
    elif edit.startswith("rope-keep"):

        def keep(module, args, output):  # the 8 highest-frequency pairs of 32 keep their rotation
            cos, sin = (x.clone() for x in output)
            cols = [f for f in range(8, 32)] + [f + 32 for f in range(8, 32)]
            cos[..., cols], sin[..., cols] = 1.0, 0.0
            return cos, sin

        with hooked((model.model.rotary_emb, keep, False)):
            reference = _loss(model, ids)
    elif edit.startswith("attend"):
        reference = _loss(model, ids, attention_mask=additive(attend_allowed(LENGTH, 4, 20)))
    elif edit.startswith("head"):
        means = {k: output_means(model, layers[k].self_attn.o_proj, ids, pre=True).unflatten(-1, (-1, d_h))
                 for k in (18, 21)}  # fmt: skip
        with hooked((layers[21].self_attn.o_proj, head_pre_hook([8], d_h, means[21]), True),
                    (layers[18].self_attn.o_proj, head_pre_hook([6], d_h, means[18]), True)):  # fmt: skip
            reference = _loss(model, ids)
    elif edit.startswith("channel"):
        with hooked((layers[5], channel_hook([100]), False)):
            reference = _loss(model, ids)
    else:
        reference = _loss(model, ids)  # shift:1000 equals no edit (rotary: i - j alone)
        shifted = _loss(model, ids, position_ids=torch.arange(LENGTH)[None] + 1000)
        np.testing.assert_allclose(shifted, reference, atol=TOL, rtol=0)
    np.testing.assert_allclose(ours, reference, atol=TOL, rtol=0)
