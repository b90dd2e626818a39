"""`posprobe needle`'s retrieval rows (SPEC §18) for families whose softmax holds more than the sequence's keys or
whose keys are picked per query: learned sinks (gpt-oss's sink column, Granite SWA's sinks on the output, Flint,
MiMo-V2-Flash's sliding layers), an indexer's top-k keys (DeepSeek Sparse Attention), both (HY-V4), key blocks
picked per key-head group (MiniMax M3), pooled entries after the keys (DeepSeek V4).

The retrieval row must be the row of the probabilities the model uses on the sequence's keys: equal to the row that
`posprobe attention` records (`capture.recording`, itself checked against each family's own eager attention in
tests/test_capture_families.py) and, for gpt-oss and MiniMax M3, to the model's own eager attentions too; the
sink's share is left out of every span, so a span over all keys sums to one less the sink's share; the model's
logits are unchanged.
"""

from __future__ import annotations

import pytest
import torch
from family_models import _EAGER_EXPERTS, case

from posprobe.capture.recording import RECORD_NAME, LayerRecorder, register_recording_attention
from posprobe.capture.retrieval import RetrievalRun

M, ROW = 40, 30  # tokens; the query row read (sliding layers of 6 or 12 keys see 19..30 or 25..30)
SPANS = [(5, 20), (24, 29), (0, M)]
SINKS = ("gpt_oss", "flint", "granite_swa", "granitemoe_swa", "mimo_v2_flash")
INDEXED = ("deepseek_v32", "glm_moe_dsa", "hy_v4")  # top-k keys per query (HY-V4: and learned sinks)
GROUPS = ("minimax_m3_vl_text",)  # key blocks picked per key-head group
POOLED = ("deepseek_v4",)  # learned sinks and, in compressed layers, entries pooled over blocks after the keys


def causal_lm(name: str):
    """The causal LM of family case `name` (tests/family_models.py), float64, its learned sinks drawn at unit scale
    (transformers starts some at 0, or all equal)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    c = case(name)
    torch.manual_seed(0)
    config = AutoConfig.for_model(c.model_type, **c.config)
    extra = {"experts_implementation": "eager"} if c.model_type in _EAGER_EXPERTS else {}
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", **extra).double().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("self_attn.sinks"):
                p.copy_(torch.randn_like(p) + 1.0)
    return model


def recorded_rows(model, ids, n_layers: int):
    """(L, H, keys) float64: row ROW of the probabilities `posprobe attention` records, and the eager logits."""
    register_recording_attention()
    model.set_attn_implementation(RECORD_NAME)
    try:
        recorder = LayerRecorder(keep_scores=False, keep_probs=True, n_layers=n_layers)
        recorder.begin(1, ids.shape[1])
        with torch.no_grad():
            recorder.taps().forward(model, input_ids=ids, use_cache=False)
        model.set_attn_implementation("eager")
        with torch.no_grad():
            eager = model(input_ids=ids, use_cache=False, output_attentions=True)
    finally:
        model.set_attn_implementation("eager")
    rows = torch.stack([p[0, :, ROW, :].double() for p in recorder.probs])
    return rows, eager


def eager_rows(model, ids):
    """(L, H, keys) float64: row ROW of the model's own eager attentions, and the eager output."""
    with torch.no_grad():
        eager = model(input_ids=ids, use_cache=False, output_attentions=True)
    return torch.stack([a[0, :, ROW, :].double() for a in eager.attentions]), eager


@pytest.mark.parametrize("name", SINKS + INDEXED + POOLED + GROUPS)
def test_retrieval_rows_are_the_probabilities_the_model_uses(name):
    model = causal_lm(name)
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    torch.manual_seed(1)
    ids = torch.randint(3, 99, (1, M))
    expected, eager = recorded_rows(model, ids, n_layers)
    with RetrievalRun(model, n_layers, n_heads) as run, torch.no_grad():
        output, attention = run.forward(ids.repeat(len(SPANS), 1), ROW, SPANS, use_cache=False)
    torch.testing.assert_close(output.logits, eager.logits.repeat(len(SPANS), 1, 1), atol=1e-6, rtol=1e-6)
    for b, (start, end) in enumerate(SPANS):
        torch.testing.assert_close(attention[b], expected[..., start:end].sum(-1), atol=1e-6, rtol=1e-6)
    for layer, module in enumerate(model.model.layers):  # a sink takes a share: the keys' row sums to less than one
        if getattr(module.self_attn, "sinks", None) is not None:
            assert float(attention[2, layer].max()) < 1 - 1e-3, layer
        else:  # MiMo-V2-Flash's full layers, DeepSeek Sparse Attention
            torch.testing.assert_close(attention[2, layer], torch.ones(n_heads).double(), atol=1e-6, rtol=0)
    assert (name in SINKS + POOLED or name == "hy_v4") == any(hasattr(m.self_attn, "sinks") for m in model.model.layers)
    if name in ("gpt_oss", *GROUPS):  # and its own eager attentions (the real keys' columns) say the same
        own = eager_rows(model, ids)[0]
        torch.testing.assert_close(attention[0], own[..., 5:20].sum(-1), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "layers, words",
    [
        (["local", "lsh", "local"], "its 'lsh' layers attend the pairs a random hash draw picks, per head and hash "
         "round; its 'local' layers attend within chunks of keys"),
        (["local", "local"], "sequence's keys: its 'local' layers attend within chunks of keys"),
        (["lsh", "lsh"], "keys: its 'lsh' layers attend the pairs a random hash draw picks, per head and hash round "
         "— `posprobe states`"),
    ],
)  # fmt: skip
def test_reformer_is_refused_saying_why(layers, words):
    """Reformer's LM is refused before any prompt is built, in one line naming its layers and why neither kind gives
    a query one row over the sequence's keys."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import posprobe
    from posprobe.errors import PosprobeError

    settings = {**case("reformer").config, "attn_layers": layers, "local_num_chunks_after": 0}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("reformer", **settings)).eval()
    with pytest.raises(PosprobeError) as error:
        posprobe.needle(model, tokenizer=object())
    assert words in str(error.value) and "\n" not in str(error.value) and "hybrid" not in str(error.value)


@pytest.mark.parametrize("name", ["laguna", "dots3_note_text-heads"])
def test_a_layer_with_fewer_query_heads_gives_nan_in_the_heads_it_lacks(name):
    """Laguna's query-head count per layer, Dots3's per layer type (SPEC §9): the retrieval rows hold the most heads
    of any layer, a layer's own heads equal to its eager attentions and NaN in the others; the heads' means and
    their ranking leave those out."""
    import numpy as np

    from posprobe.analysis.needle import head_means, ranked_heads
    from posprobe.capture.model import check_model

    model = causal_lm(name)
    n_layers, n_heads = check_model(model, hybrid=True)
    torch.manual_seed(1)
    ids = torch.randint(3, 99, (1, M))
    with torch.no_grad():
        eager = model(input_ids=ids, use_cache=False, output_attentions=True)
    with RetrievalRun(model, n_layers, n_heads) as run, torch.no_grad():
        output, attention = run.forward(ids.repeat(len(SPANS), 1), ROW, SPANS, use_cache=False)
    counts = [a.shape[1] for a in eager.attentions]
    assert len(set(counts)) > 1 and max(counts) == n_heads == attention.shape[-1]
    for layer, probs in enumerate(eager.attentions):
        heads = probs.shape[1]
        for b, (start, end) in enumerate(SPANS):
            expected = probs[0, :, ROW, start:end].double().sum(-1)
            torch.testing.assert_close(attention[b, layer, :heads], expected, atol=1e-6, rtol=1e-6)
        assert torch.isnan(attention[:, layer, heads:]).all()
    means = head_means(attention.numpy()[None, None])
    assert np.isfinite(means).sum() == sum(counts)  # every head a layer has; none it lacks
    assert len(ranked_heads(means)) == sum(counts)
