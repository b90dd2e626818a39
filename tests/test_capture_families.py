"""The capture layer on every family of the family test matrix (tests/family_models.py) and the relative-bias and
disentangled families (T5, UMT5, MPNet, DeBERTa-v2, DeBERTa): what reducers see equals what each model computes on
each text alone, and `posprobe attention`'s numbers equal a direct computation from them.

- per text, unpadded, the model's own eager run (`output_attentions`, `output_hidden_states`; an encoder-decoder's
  encoder) gives the probabilities and hidden states the capture handed over from padded batches; the captured
  pre-softmax scores S give those probabilities (S - log A is constant along each query row over the pairs the
  model attends) and mark exactly the pairs it does not attend;
- on the constant sequence of the average word, layer 0's S equals the model's own pre-softmax scores as the
  family parity tests record them (`family_models.reference_scores`);
- profiles and sinks of `attention_profiles` equal explicit loops over the pairs of each text alone, from its
  returned attentions and its softmax inputs (recorded by patching `softmax`, not through the capture);
- families whose attention is not one (queries x keys) softmax per layer, or whose eager path is another model
  than the one it runs by default, are refused in one line.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers as tf
from conftest import build_tiny
from family_models import CASES, FLOAT32, _layers, _on_one_head_axis, _SoftmaxInputs, build, case, reference_scores
from tiny_tokenizer import word_tokenizer

from posprobe.architectures.table import EAGER
from posprobe.architectures.table import REFUSED as REFUSED_ROUTE
from posprobe.capture import capture
from posprobe.capture.eager import MASKED_EXACTLY, is_eager_route
from posprobe.capture.model import attention_layers, stack_to_run
from posprobe.errors import PosprobeError
from posprobe.families import family_for_type
from posprobe.pipelines.attention import attention_profiles

_T5 = dict(vocab_size=99, d_model=32, d_kv=8, num_heads=4, d_ff=37, num_layers=2, num_decoder_layers=2,
           relative_attention_num_buckets=10, relative_attention_max_distance=24, dropout_rate=0.0)  # fmt: skip
_BERT_LIKE = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                  max_position_embeddings=64)  # fmt: skip
# families whose scores are tested in tests/test_families_bias.py, built here the same way
EXTRA = {
    "t5": lambda: tf.T5Model(tf.T5Config(**_T5)),
    "umt5": lambda: tf.UMT5Model(tf.UMT5Config(**_T5)),
    "mpnet": lambda: tf.MPNetModel(tf.MPNetConfig(**_BERT_LIKE)),
    "deberta-v2": lambda: tf.DebertaV2Model(tf.DebertaV2Config(
        **_BERT_LIKE, relative_attention=True, pos_att_type="p2c|c2p", share_att_key=True, position_buckets=8,
        max_relative_positions=32, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0)),
    "deberta": lambda: tf.DebertaModel(tf.DebertaConfig(
        **_BERT_LIKE, relative_attention=True, pos_att_type=["c2p", "p2c"], max_relative_positions=12,
        type_vocab_size=2)),
    # the BERT-family checkpoints of tests/conftest.py
    **{family: (lambda family=family: build_tiny(family)) for family in
       ("roberta", "xlm-roberta", "albert", "electra", "distilbert")},
    # refused (below)
    "longt5": lambda: tf.LongT5Model(tf.LongT5Config(**_T5, local_radius=5)),
    "deberta-talking-heads": lambda: tf.DebertaModel(tf.DebertaConfig(
        **_BERT_LIKE, relative_attention=True, pos_att_type="p2c|c2p|p2p", max_relative_positions=-1,
        type_vocab_size=0, position_biased_input=False, talking_head=True)),
}  # fmt: skip
# hybrids: softmax attention in some layers (recorded), recurrent / state-space / convolution layers in the others
HYBRIDS = ("lfm2", "bamba", "jamba", "qwen3_next", "granitemoehybrid", "granitemoehybrid-nope", "minimax",
           "olmo_hybrid", "lfm2_moe", "qwen3_5_text", "qwen3_5_moe_text", "nemotron_h",
           "recurrent_gemma", "zamba", "zamba2", "zamba2-nope", "kimi_linear", "bailing_hybrid", "lara_mini",
           "lfm3", "qwen3_5", "qwen3_5_moe", "mllama")  # fmt: skip
HYBRIDS += ("qwen4_exp_text", "qwen4_exp")  # issue 34 (qwen4)


def _eager_falcon_alibi_is_sdpa() -> bool:
    """Whether the installed transformers' eager Falcon-ALiBi gives its sdpa outputs: before 5.25 its eager path added
    the bias twice (in its scores and again in its mask), and posprobe's first-batch check refuses such a model; from
    5.25 on Falcon runs through AttentionInterface and both paths agree. Decided by running both, never assumed."""
    torch.manual_seed(0)
    model = build("falcon-alibi").float().eval()
    ids = torch.tensor([[5, 9, 2, 7, 11, 3, 8]])
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        sdpa = model(ids).last_hidden_state
        model.set_attn_implementation("eager")
        if model.config._attn_implementation != "eager":
            return False
        eager = model(ids).last_hidden_state
    return torch.allclose(eager, sdpa, atol=1e-5)


REFUSED = {
    "longformer": "not one softmax over all keys",  # sliding chunks
    "longt5": "not one softmax over all keys",  # blockwise local attention
    "deberta-talking-heads": "does not give its returned attention",  # heads mixed after the softmax
    "mllama": r"skips its layers \[1\] on text",  # hidden states: none enters its skipped cross-attention layer
}
if not _eager_falcon_alibi_is_sdpa():  # transformers < 5.25 (see above); read, and tested in ALL, from 5.25 on
    REFUSED["falcon-alibi"] = "eager attention .* gives other outputs than its sdpa"
# the sequence pooled between blocks (Funnel): its first block's layers recorded from their own modules, its later
# blocks' and upsampling decoder's listed (no positional score); hidden states refused (no state per position)
POOLED = ("funnel", "funnel-factorized")
NO_HIDDEN_STATES = {"mllama"}  # refused for hidden states only: its attention is checked with the hybrids
# stacks run one after another (BLT: byte encoder, global transformer over patches, byte decoder): its byte layers'
# attention is recorded (the global layers are a hybrid's other layers), its hidden states are refused in one line
STACKED = {"blt": "stacks over its bytes and over patches"}
# in the default run (a few seconds in all): T5 (encoder stack, bucket bias) and BLOOM (ALiBi, causal) here, MPNet
# and DeBERTa-v2 in the tests below; every other family, the AttentionInterface ones included (also covered by
# tests/test_capture.py), runs in the slow tier
QUICK = {"t5", "bloom", "falcon-alibi"}  # falcon-alibi: read from transformers 5.25 on (its eager ALiBi fixed)
# several streams per layer as their hidden states (Gemma 3n's AltUp stack, HY-V4's hyper-connections): no one
# hidden state per layer: a capture that asks for them is refused in one line (test_capture_equals_each_text_run_alone)
STREAMS = {"gemma3n_text", "hy_v4", "deepseek_v4"}
STREAMS |= {"gemma3n"}  # issue 34 (wrap): Gemma 3n's wrapper runs its language model
STREAMS |= {"qwen4_exp_text", "qwen4_exp"}  # issue 34 (qwen4): its hyper-connection streams
# entries pooled over blocks of tokens follow the keys in some layers' softmax (DeepSeek V4's compressed layers): the
# model's attentions and softmax inputs are read over the sequence's keys
POOLED_KEYS = {"deepseek_v4"}
RETURNS_SCORES = {"squeezebert", "prophetnet"}  # their `output_attentions` are the pre-softmax scores
# models whose input is not one token sequence (MusicGen: one token of each codebook at every position): no capture
NOT_TEXT = {"musicgen_decoder", "musicgen_melody_decoder"}
# attention rebuilt from neighbour chunks (Reformer's local layers; its LSH layers listed): texts of some lengths are
# refused (a chunk its own neighbour), and its eager run returns per-chunk attentions: tested on their own below
CHUNKED = ("reformer", "reformer-masked")
# cases of an encoder-decoder's decoder (--stack decoder): `attention` runs the encoder, its case's own
DECODER_STACK = {name for name in CASES if case(name).stack == "decoder"}  # issue 34 (stacks)
ALL = sorted(set(CASES) - set(REFUSED) - NOT_TEXT - set(CHUNKED) - DECODER_STACK) + sorted(set(EXTRA) - set(REFUSED))
# learned sinks applied to the output: the eager attention returns the softmax over the real keys and scales its
# output by sigmoid(logsumexp_j S(i, j) - s_h), the share a sink column s_h would leave them (gpt-oss's sinks, the
# same weights on the values): the capture's A is those weights, as for gpt-oss
SINKS_ON_OUTPUT = {"granite_swa", "granitemoe_swa"}
# a block indexer per key-head group: each query head attends its group's key blocks (allowed pairs per head)
GROUP_MASKS = {"minimax_m3_vl_text"}


def _params(names, quick=QUICK):
    return [pytest.param(n, marks=() if n in quick else pytest.mark.slow) for n in names]


# transformers' float64 Gemma 2 / 3, NeoMME and ZAYA give NaN on real tokens when a sliding window meets padding (a
# padded query row with every key masked, then 0 x NaN in later layers): these run in float32, as real checkpoints do
IN_FLOAT32 = FLOAT32 | {"gemma2", "gemma3_text", "gemma3_text-bidirectional", "lara_mini", "lfm3", "inkling_text",
                        "gemma3n_text", "gemma4_text", "gemma4_unified_text", "neomme", "zaya"}  # fmt: skip
# transformers' float64 ProphetNet encoder builds its padding mask in float32 (0 x -inf: NaN on every real key)
IN_FLOAT32 |= {"prophetnet"}
IN_FLOAT32 |= {"gemma3", "gemma4", "gemma4_unified"}
IN_FLOAT32 |= {"gemma3n"}  # issue 34 (wrap)
# float64 eager Dots3: a sliding row whose keys are all padding takes the float64 minimum, -inf in its float32
# softmax (NaN), which its next indexed layer spreads to every token
IN_FLOAT32 |= {"dots3_note_text", "dots3_note_text-heads", "dots3_note"}
# transformers' float64 BLT masks its cross-attention in float64 and softmaxes in float32: a patch of no byte (the
# one after the last) gets a row of -inf, NaN, and NaN reaches every byte through the global layers' values
IN_FLOAT32 |= {"blt"}
IN_FLOAT32 |= {"laguna"}  # its float64 eager attention gives NaN on real tokens beside padding in a window, as above
IN_FLOAT32 |= {"ergo", "kolibri1_1", "kolibri1_1-pool"}  # issue 44: the same


def tolerance(name: str) -> float:
    """On probabilities (<= 1), between a padded batch and each text alone: float64 models agree to the float32
    rounding of softmaxes that several families (and the AttentionInterface route) take in float32."""
    return 2e-5 if name in IN_FLOAT32 else 1e-6


def make(name: str):
    """A tiny random model of case `name` (eval mode; float64 unless the family cannot run in it)."""
    if name in EXTRA:
        torch.manual_seed(0)
        model = EXTRA[name]().double().eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname.lower() or pname.endswith("bias"):
                    p.add_(0.1 * torch.randn_like(p))
        return model
    return build(name, torch.float32 if name in IN_FLOAT32 else None)


def texts(count: int = 7, seed: int = 1) -> list[list[int]]:
    """Token ids 4..98 (never a family's pad, mask or special id), lengths 2..11: batches of 3 are padded."""
    rng = np.random.default_rng(seed)
    return [rng.integers(4, 99, size=int(rng.integers(2, 12))).tolist() for _ in range(count)]


def alone(model, ids: list[int], returns_scores: bool = False, per_layer: bool = False, per_head: bool = False) -> dict:
    """The model's own eager run on one unpadded text: probabilities A and hidden states from its outputs, the
    softmax inputs S recorded by patching softmax (A, H, n, n: its A attention layers, every layer but a hybrid's
    others); the pairs it attends, A > 0. `per_layer`: also `attending`, the layers (hooked one by one) whose
    forward pass ran a (queries x keys) softmax: an oracle of which layers attend, independent of the config.
    `per_head`: `allowed` (A, H, n, n), each head's own pairs (a block indexer per key-head group)."""
    net = stack_to_run(model)
    previous = net.config._attn_implementation
    net.set_attn_implementation("eager")
    if getattr(net, "attention_type", None) == "block_sparse":  # what BigBird does itself on short inputs
        net.set_attention_type("original_full")
    n = len(ids)
    attending, hooks = [], []
    pooled = net.config.num_attention_heads if net.config.model_type in POOLED_KEYS else None
    try:
        with torch.no_grad(), _SoftmaxInputs(n, pooled, net) as softmax:
            for layer, module in enumerate(_layers(net) if per_layer else []):
                before = module.register_forward_pre_hook(lambda *_, m=module: setattr(m, "_seen", len(softmax.inputs)))
                after = module.register_forward_hook(
                    lambda m, *_, layer=layer: attending.append(layer) if len(softmax.inputs) > m._seen else None
                )
                hooks += [before, after]
            out = net(input_ids=torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
        net.set_attn_implementation(previous)
    returned = list(out.attentions)
    layers = net.config.get_text_config().num_hidden_layers  # a multimodal wrapper: its language model's
    if len(returned) == layers > len(softmax.inputs):  # MiniMax also returns its linear layers' decay: keep the
        returned = [returned[layer] for layer in attention_layers(net)]  # attention layers
    keys = n if pooled else None  # pooled entries after the sequence's keys: cut
    returned = _on_one_head_axis([a[0, ..., :keys].double().numpy() for a in returned])
    if returns_scores:
        scores = returned
        probs = torch.softmax(torch.from_numpy(returned), -1).numpy()
    else:
        scores, probs = _on_one_head_axis(_once(softmax.inputs, len(returned))), returned
    return dict(
        probs=probs,
        scores=scores,
        allowed=probs > 0 if per_head else probs[:, 0] > 0,  # (L, n, n), or (L, H, n, n) per head
        hidden=[h[0].double().numpy() for h in out.hidden_states],
        attending=attending,
    )


def _module_runs(net, modules: list, ids: list[int], **kwargs) -> tuple:
    """(output, A, S) of `net`'s own run on one unpadded text with each of `modules` hooked: per module the attention
    it returns and the inputs of the softmaxes made inside it (softmax patched, `_SoftmaxInputs`), one each."""
    probs, made, hooks = [None] * len(modules), [[] for _ in modules], []
    try:
        with torch.no_grad(), _SoftmaxInputs(len(ids)) as softmax:

            def ran(index):
                def hook(module, args, out):
                    probs[index] = out[1][0].double().numpy()
                    made[index].extend(softmax.inputs[module._seen :])

                return hook

            for index, module in enumerate(modules):
                before = module.register_forward_pre_hook(lambda *_, m=module: setattr(m, "_seen", len(softmax.inputs)))
                hooks += [before, module.register_forward_hook(ran(index))]
            out = net(input_ids=torch.tensor([ids]), output_attentions=True, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    assert all(len(inputs) == 1 for inputs in made)  # one softmax in each hooked module
    return out, probs, made


def alone_stacked(model, ids: list[int]) -> dict:
    """`alone` for stacks run one after another (BLT, `STACKED`): its own eager run on one unpadded text, patches
    as its config picks them; per self-attention layer of its byte stacks (encoder, then decoder) A as that module
    returns it and S the input of the softmax made inside it (softmax patched, `_SoftmaxInputs`); `attending` their
    layer numbers (the decoder's after the global transformer's); no hidden states. The decoder's A are also the
    last attentions the model returns (its entropy model's layers, where it runs one, come first)."""
    net = stack_to_run(model)
    previous = net.config._attn_implementation
    net.set_attn_implementation("eager")
    modules = [layer.self_attn for layer in _layers(net)]
    try:
        out, probs, made = _module_runs(net, modules, ids, use_cache=False)
    finally:
        net.set_attn_implementation(previous)
    decoder = len(net.local_decoder.layers)
    returned = np.stack([a[0].double().numpy() for a in out.attentions[-decoder:]])  # after its entropy model's
    np.testing.assert_array_equal(returned, np.stack(probs[-decoder:]))
    encoder, middle = len(net.local_encoder.layers), len(net.global_transformer.layers)
    probs = np.stack(probs)
    return dict(
        probs=probs,
        scores=np.stack([inputs[0] for inputs in made]),
        allowed=probs[:, 0] > 0,
        hidden=[],
        attending=[*range(encoder), *range(encoder + middle, encoder + middle + decoder)],
    )


def alone_pooled(model, ids: list[int]) -> dict:
    """`alone` for a model that pools the sequence between blocks (Funnel, `POOLED`): its own eager run on one
    unpadded text; per layer of its first block (`attending`: the layers at the text's positions) A as its attention
    module returns it and S the input of the softmax made inside it (softmax patched, `_SoftmaxInputs`); `layers`
    the attentions it returns, one per layer run (later blocks and decoder included); no hidden states."""
    net = stack_to_run(model)
    modules = [layer.attention for layer in net.encoder.blocks[0]]
    out, probs, made = _module_runs(net, modules, ids)
    returned = [a[0].double().numpy() for a in out.attentions]
    for got, theirs in zip(probs, returned, strict=False):  # the first block's come first
        np.testing.assert_array_equal(got, theirs)
    probs = np.stack(probs)
    return dict(
        probs=probs,
        scores=np.stack([inputs[0] for inputs in made]),
        allowed=probs[:, 0] > 0,
        hidden=[],
        attending=list(range(len(modules))),
        layers=len(returned),
    )


def _once(inputs: list, layers: int) -> list:
    """The softmax inputs of each layer once: where a model ran two identical softmaxes per layer (DiffLlama's
    differential attention: one call per half of its values), the second of each pair, checked equal, is dropped."""
    if len(inputs) != 2 * layers or layers == 0:
        return inputs
    for first, second in zip(inputs[::2], inputs[1::2], strict=True):
        np.testing.assert_array_equal(first, second)
    return inputs[::2]


def _sink_scale(model, scores: np.ndarray) -> np.ndarray:
    """(L, H, n, 1) sigmoid(logsumexp_j S(i, j) - s_h): what a model with output-side sinks scales each row by."""
    sinks = np.stack([layer.self_attn.sinks.detach().double().numpy() for layer in _layers(stack_to_run(model))])
    top = scores.max(-1, keepdims=True)
    lse = top + np.log(np.exp(scores - top).sum(-1, keepdims=True))
    return 1 / (1 + np.exp(sinks[:, :, None, None] - lse))


class Keep:
    """Keeps, per text, what the capture handed over for its real tokens (`hidden`: hidden states too)."""

    def __init__(self, hidden: bool = True):
        self.texts: dict[int, dict] = {}
        self.needs = ("scores", "probs", "hidden_states") if hidden else ("scores", "probs")

    def add(self, batch) -> None:
        for row, text in enumerate(batch.text_ids.tolist()):
            n = int(batch.real[row].sum())
            self.texts[text] = dict(
                scores=np.stack([s[row, :, :n, :n].double().numpy() for s in batch.scores]),
                probs=np.stack([a[row, :, :n, :n].double().numpy() for a in batch.probs]),
                allowed=_allowed_of(batch, row, n),
                hidden=[h[row, :n].double().numpy() for h in batch.hidden_states or ()],
            )

    def result(self):
        return self.texts


def _allowed_of(batch, row: int, n: int) -> np.ndarray:
    """(L, n, n) the allowed pairs of text `row` (its n real tokens) in every layer, or (L, H, n, n) where some
    layer's heads have pairs of their own (the other layers' broadcast to every head)."""
    layers = [p[row, ..., :n, :n].numpy() for p in batch.allowed]
    heads = max((x.shape[0] for x in layers if x.ndim == 3), default=None)
    return np.stack(layers if heads is None else [np.broadcast_to(x, (heads, n, n)) for x in layers])


@pytest.mark.parametrize("name", _params(ALL))
def test_capture_equals_each_text_run_alone(name):
    model = make(name)
    reference = copy.deepcopy(model)
    corpus = texts()
    if name in POOLED:  # transformers' Funnel fails on 2 tokens (separate_cls): batches of 3 tokens or more
        corpus = [ids for ids in corpus if len(ids) > 2]
    keep = Keep(hidden=name not in STREAMS and name not in STACKED and name not in POOLED)
    if name in STREAMS:  # hidden states of several streams per layer: refused in one line
        with pytest.raises(PosprobeError, match="not \\(batch, tokens, width\\)"):
            capture(model, [Keep()], input_ids=corpus, max_length=16, batch_size=3)
    summary = capture(model, [keep], input_ids=corpus, max_length=16, batch_size=3)
    tol = tolerance(name)
    family = family_for_type(model.config.model_type)
    assert is_eager_route(model) == (family.capture == EAGER)  # the route the family table names
    batches = len(corpus) if family.reads_padding else -(-len(corpus) // 3)  # ConvBERT's convolutions read padding
    assert summary.n_batches == batches and sorted(keep.texts) == list(range(len(corpus)))
    for index, ids in enumerate(corpus):
        got = keep.texts[index]
        if name in STACKED:
            ref = alone_stacked(reference, ids)
        elif name in POOLED:
            ref = alone_pooled(reference, ids)
            assert list(summary.attention_layers) == ref["attending"] and summary.n_layers == ref["layers"]
            assert 0 < len(ref["attending"]) < ref["layers"]
        else:
            ref = alone(reference, ids, name in RETURNS_SCORES, name in HYBRIDS, name in GROUP_MASKS)
        if name in SINKS_ON_OUTPUT:
            ref["probs"] = ref["probs"] * _sink_scale(reference, ref["scores"])
        if name in HYBRIDS or name in STACKED:  # the attention layers only, exactly those the model's own run ran
            assert list(summary.attention_layers) == ref["attending"] and 0 < len(ref["attending"]) < summary.n_layers
        np.testing.assert_allclose(got["probs"], ref["probs"], rtol=tol, atol=tol, err_msg=f"{name} text {index}")
        for ours, theirs in zip(got["hidden"], [] if name in STREAMS else ref["hidden"], strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=tol * 100, atol=tol * 100)
        np.testing.assert_array_equal(got["allowed"], ref["allowed"])  # masks: padding, causality, windows
        present = ~np.isnan(ref["scores"]).all((-2, -1))  # (L, H): heads a layer lacks (Laguna, SPEC §9) are NaN
        assert np.isnan(got["scores"][~present]).all() and np.isnan(got["probs"][~present]).all()
        allowed = np.broadcast_to(
            ref["allowed"] if name in GROUP_MASKS else ref["allowed"][:, None], got["scores"].shape
        )
        masked = got["scores"][~allowed & present[..., None, None]]
        assert ((masked < -1e30) | (masked == MASKED_EXACTLY)).all()  # OpenAI GPT: -1e4 exactly
        # the pairs a softmax gives a probability > 1e-8: below it a float32 exp's relative error depends on the CPU
        # kernel and its threads (inkling2 on AVX2 with 2 threads: 3e-4 on a probability of 4e-16), and such pairs
        # say nothing of which S fed the softmax
        weighed = allowed & (np.broadcast_to(ref["probs"], allowed.shape) > 1e-8)
        with np.errstate(divide="ignore", invalid="ignore"):  # masked pairs: -inf - log 0
            shift = np.where(weighed, got["scores"] - np.log(ref["probs"]), np.nan)[present]  # log-sum-exp of a row
        rows = ~np.isnan(shift).all(-1)  # a row whose every pair is below 1e-8 (a sink took it all): nothing to read
        spread = np.nanmax(shift[rows], -1) - np.nanmin(shift[rows], -1)
        # S in a padded batch is the model's own arithmetic on another shape than the text alone: float32 GEMMs and
        # key-axis reductions round by the batch's rows, padded length and threads (an ulp or so per activation), each
        # softmax over logits of size R turns a relative error e of q and k into R e of S and of its weights, so the
        # layers grow it (Inkling 2: 10-80 ulps of q and k by its 4th layer). Each row may spread by 10 tol plus 2^7
        # ulps (of the model's dtype) of R, the row's largest |S|: Inkling 2's L2-clipped q, k (norms <= 10, head_dim
        # 8) reach R ~ 35, a spread of 2e-4 (1 thread) to 3e-4 (2 threads); a bug of 1e-3 in S still fails
        largest = np.where(allowed, np.abs(ref["scores"]), 0)[present].max(-1)  # (P, n): R of each query row
        limit = 10 * tol + 2**7 * torch.finfo(model.dtype).eps * largest[rows]
        assert rows.mean() > 0.5 and (spread < limit).all(), f"{name}: S is not the input of the softmax that gave A"


# ALBERT's one shared layer is not the per-layer list `reference_scores` feeds; a hybrid's layer 0 may not attend
# (Reformer's masked LM: an LSH layer 0; its LM's local layer 0 is read); BLT's bytes add hashed n-gram rows picked by
# content, not the average rows `reference_scores` feeds
@pytest.mark.parametrize("name", _params([n for n in ALL if n != "albert" and n not in HYBRIDS and n not in STACKED]
                                         + ["reformer"], quick={"mpnet"}))  # fmt: skip
def test_layer_zero_scores_on_the_average_word_are_the_models_own(name):
    """Every token the average word (`reference_scores` sets row 0 of the word table to the table's mean), no
    padding: layer 0's input is the embedding-level sequence, so its S is the model's own pre-softmax score of
    the parity tests (masked pairs aside)."""
    model = make(name)
    n = 12
    word = case(name).word_id if name in CASES else 0  # CPM-Ant reads token 0 as padding
    ref = reference_scores(model, n, word)  # also sets the average word
    keep = Keep(hidden=name not in STREAMS | set(CHUNKED) | set(POOLED))  # Reformer pads 12 to 16: hidden states of 16
    capture(model, [keep], input_ids=[[word] * n], max_length=n)
    got = keep.texts[0]
    allowed = np.broadcast_to(ref.allowed[0], got["scores"][0].shape)  # (n, n) or (H, n, n)
    tol = 1e-4 if name in IN_FLOAT32 else 1e-9
    np.testing.assert_allclose(got["scores"][0][allowed], ref.scores[0][allowed], rtol=tol, atol=tol)
    mine = got["allowed"][0]  # (n, n), or (H, n, n) where another layer's heads have pairs of their own
    np.testing.assert_array_equal(mine, np.broadcast_to(ref.allowed[0], mine.shape))


def brute_force(
    model, corpus, n: int, first_special: bool, n_layers: int | None = None, run=alone, heads: int | None = None
) -> dict:
    """SPEC §10 profiles and SPEC §14 sinks by loops over each text alone: pairs (i, j) it attends, S and A from
    `alone`; the first token of every text marked special. The first-token mass and its uniform reference run over
    the queries i >= 1 that may see key 0 (a sliding window hides it from later ones); a(k) without the first token
    over the pairs with i, j >= 1. `n_layers`: a hybrid's attention layers (those `alone` returns); `run`: `alone`, or
    `alone_stacked` (BLT) with the `heads` of its byte stacks (its config names no head count of its own)."""
    L = model.config.get_text_config().num_hidden_layers if n_layers is None else n_layers
    H = heads or model.config.get_text_config().num_attention_heads
    s_sum, a_sum, c = np.zeros((L, H, 2 * n - 1)), np.zeros((L, H, 2 * n - 1)), np.zeros((L, 2 * n - 1))
    dist, queries = np.zeros((L, H)), np.zeros(L)
    first, special, later_dist, later_n, sink_queries = np.zeros((L, H)), np.zeros((L, H)), 0.0, 0, 0
    later_dist = np.zeros((L, H))
    first_n, uniform_first = np.zeros(L), np.zeros(L)
    a_later, c_later = np.zeros((L, H, 2 * n - 1)), np.zeros((L, 2 * n - 1))
    for ids in corpus:
        ref = run(model, ids)
        S, A, allowed = ref["scores"], ref["probs"], ref["allowed"]
        m = len(ids)
        for layer in range(L):
            for i in range(m):
                keys = [j for j in range(m) if allowed[layer, i, j]]
                queries[layer] += 1
                for j in keys:
                    c[layer, j - i + n - 1] += 1
                    s_sum[layer, :, j - i + n - 1] += S[layer, :, i, j]
                    a_sum[layer, :, j - i + n - 1] += A[layer, :, i, j]
                    dist[layer] += A[layer, :, i, j] * abs(j - i)
                if i == 0:
                    continue
                for j in keys:
                    if j >= 1:
                        c_later[layer, j - i + n - 1] += 1
                        a_later[layer, :, j - i + n - 1] += A[layer, :, i, j]
                if allowed[layer, i, 0]:
                    first[layer] += A[layer, :, i, 0]
                    first_n[layer] += 1
                    uniform_first[layer] += 1 / len(keys)
                special[layer] += A[layer, :, i, 0] if first_special else 0.0
                later = [j for j in keys if j >= 1]
                mass = sum(A[layer, :, i, j] for j in later)
                later_dist[layer] += sum(A[layer, :, i, j] * abs(j - i) for j in later) / mass
        sink_queries += m - 1
        later_n += m - 1
    with np.errstate(invalid="ignore"):
        return dict(
            score_profiles=s_sum / c[:, None],
            prob_profiles=a_sum / c[:, None],
            pair_counts=c,
            mean_distance=dist / queries[:, None],
            first_token_mass=first / first_n[:, None],
            first_token_queries=first_n,
            uniform_first_token_mass=uniform_first / first_n,
            prob_profiles_without_first=a_later / c_later[:, None],
            special_token_mass=special / sink_queries,
            distance_without_first=later_dist / later_n,
        )


@pytest.mark.parametrize("name", _params(["t5", "bloom", "deberta-v2", "mpnet", "marian", "megatron-bert", "falcon",
                                          "gpt_neo", "xglm", "big_bird", "llama", "gemma3_text", "diffllama"],
                                         quick={"deberta-v2"}))  # fmt: skip
def test_attention_profiles_and_sinks_equal_loops_over_each_text(name):
    model = make(name)
    corpus = [[5, *ids] for ids in texts(6, seed=7)]  # token 5 first: the one special token
    n = 13
    ref = brute_force(copy.deepcopy(model), corpus, n, first_special=True)
    result = attention_profiles(
        model, input_ids=corpus, special_ids=[5], max_length=n, batch_size=3, weights_correlation=False
    )
    tol = tolerance(name)
    p, sinks = result.profiles, result.sinks
    np.testing.assert_array_equal(p.pair_counts, ref["pair_counts"])
    for what in ("score_profiles", "prob_profiles", "mean_distance"):
        np.testing.assert_allclose(getattr(p, what), ref[what], rtol=tol, atol=tol, err_msg=what)
    for what in ("first_token_mass", "special_token_mass", "distance_without_first", "uniform_first_token_mass"):
        np.testing.assert_allclose(getattr(sinks, what), ref[what], rtol=tol, atol=tol, err_msg=what)
    np.testing.assert_array_equal(sinks.first_token_queries, ref["first_token_queries"])
    np.testing.assert_allclose(p.prob_profiles_without_first, ref["prob_profiles_without_first"], rtol=tol, atol=tol)
    assert result.n_layers == 2 and result.model_type == model.config.model_type


PROFILE_ARRAYS = ("score_profiles", "prob_profiles", "mean_distance", "prob_profiles_without_first")
SINK_MEASURES = ("first_token_mass", "special_token_mass", "distance_without_first", "uniform_first_token_mass")


@pytest.mark.parametrize("name", _params([*HYBRIDS, *sorted(STACKED), *POOLED], quick={"jamba"}))
def test_a_hybrids_attention_layers_equal_loops_over_each_text_and_its_other_layers_have_no_score(name):
    """Profiles and sinks of a hybrid's attention layers equal the loops over its own eager attention (each text
    alone); its other layers (recurrent / state-space / convolution; BLT's global layers over patches) hold NaN
    (counts 0) and say 'no positional score' in `layer_kinds`, in the JSON record and in the figures."""
    import json

    from posprobe.families.windows import NO_SCORE
    from posprobe.plotting.attention import mean_distance_chart, profile_grid, sink_chart

    model = make(name)
    corpus = [[5, *ids] for ids in texts(6, seed=7)]
    if name in STACKED:  # its three stacks' layers; the byte stacks' modules hooked
        n, L = 13, sum(len(getattr(model, s).layers) for s in ("local_encoder", "global_transformer", "local_decoder"))
        attending = alone_stacked(copy.deepcopy(model), corpus[0])["attending"]
    elif name in POOLED:  # every layer it runs, its decoder's too; the first block's modules hooked
        first = alone_pooled(copy.deepcopy(model), corpus[0])
        n, L, attending = 13, first["layers"], first["attending"]
    else:
        n, L = 13, model.config.get_text_config().num_hidden_layers
        attending = alone(copy.deepcopy(model), corpus[0], per_layer=True)[
            "attending"
        ]  # hooked: the layers that attend
    others = [layer for layer in range(L) if layer not in attending]
    assert attending and others
    run, heads = (alone_stacked, model.config.encoder_config.num_attention_heads) if name in STACKED else (alone, None)
    run = alone_pooled if name in POOLED else run
    ref = brute_force(copy.deepcopy(model), corpus, n, True, n_layers=len(attending), run=run, heads=heads)
    result = attention_profiles(
        model, input_ids=corpus, special_ids=[5], max_length=n, batch_size=3, weights_correlation=False
    )
    tol = tolerance(name)
    p, sinks = result.profiles, result.sinks
    np.testing.assert_array_equal(p.pair_counts[attending], ref["pair_counts"])
    assert (p.pair_counts[others] == 0).all() and (p.n_queries[others] == 0).all()
    for what in PROFILE_ARRAYS:
        np.testing.assert_allclose(getattr(p, what)[attending], ref[what], rtol=tol, atol=tol, err_msg=what)
        assert np.isnan(getattr(p, what)[others]).all(), what
    for what in SINK_MEASURES:
        np.testing.assert_allclose(getattr(sinks, what)[attending], ref[what], rtol=tol, atol=tol, err_msg=what)
        assert np.isnan(getattr(sinks, what)[others]).all(), what
    np.testing.assert_array_equal(sinks.first_token_queries[attending], ref["first_token_queries"])
    assert np.isnan(sinks.sink_rate[others]).all() and np.isfinite(sinks.sink_rate[attending]).all()
    assert result.n_layers == L and result.attention_layers == attending
    assert [NO_SCORE in kind for kind in result.layer_kinds] == [layer in others for layer in range(L)]
    record = json.loads(json.dumps(result.to_dict()))
    assert record["layer_kinds"] == result.layer_kinds and record["attention_layers"] == attending
    assert all(v is None for layer in others for v in record["mean_distance"][layer])
    assert all(v is not None for layer in attending for v in record["mean_distance"][layer])
    assert record["n_queries"] == int(p.n_queries[attending[0]]) > 0
    assert NO_SCORE in profile_grid(result, others[0])._suptitle.get_text()
    for chart in (mean_distance_chart(result), sink_chart(result)):  # the other layers' columns say why blank
        words = [t.get_text() for ax in chart.axes for t in ax.texts]
        assert sum(NO_SCORE in w for w in words) == len(others)


@pytest.mark.slow
def test_a_query_head_count_per_layer_leaves_the_heads_a_layer_lacks_out_everywhere(capsys):
    """Laguna (2, 4, 2, 4 query heads): profiles and sinks of the heads each layer has equal the loops over its own
    eager attention (each text alone); the heads a layer lacks are NaN in every per-head array (SPEC §9, as in F̂),
    and the JSON record, the figures and the text table leave them out or say 'no such head'."""
    import json

    from posprobe.cli.attention import _print
    from posprobe.plotting.attention import mean_distance_chart, profile_grid, sink_chart

    model = make("laguna")
    corpus = [[5, *ids] for ids in texts(6, seed=7)]
    n = 13
    ref = brute_force(copy.deepcopy(model), corpus, n, first_special=True)
    result = attention_profiles(
        model, input_ids=corpus, special_ids=[5], max_length=n, batch_size=3, weights_correlation=False
    )
    counts = np.array(model.config.num_attention_heads_per_layer)
    present = np.arange(result.n_heads)[None] < counts[:, None]  # (L, H)
    assert result.n_heads == counts.max() and not present.all()
    np.testing.assert_array_equal(result.present_heads, present)
    tol = tolerance("laguna")
    p, sinks = result.profiles, result.sinks
    for what in PROFILE_ARRAYS:  # NaN where the loops give NaN: the missing heads (equal_nan)
        np.testing.assert_allclose(getattr(p, what), ref[what], rtol=tol, atol=tol, err_msg=what)
        values = getattr(p, what)
        assert np.isnan(values[~present]).all()
        assert np.isfinite(values[present]).reshape(present.sum(), -1).any(-1).all()
    for what in SINK_MEASURES:
        np.testing.assert_allclose(getattr(sinks, what), ref[what], rtol=tol, atol=tol, err_msg=what)
    assert np.isnan(sinks.first_token_mass[~present]).all() and np.isfinite(sinks.first_token_mass[present]).all()
    assert np.isnan(p.toeplitz_r2[~present]).all() and np.isfinite(p.toeplitz_r2[present]).all()
    expected = [(ref["first_token_mass"][layer, :c] > sinks.threshold).mean() for layer, c in enumerate(counts)]
    np.testing.assert_allclose(sinks.sink_rate, expected)  # over the heads the layer has
    blocks = attention_profiles(  # the blockwise route (SPEC §19) pads each block's heads the same way
        model, input_ids=corpus, special_ids=[5], max_length=n, batch_size=3, weights_correlation=False, block_size=4
    )
    for what in PROFILE_ARRAYS:
        np.testing.assert_allclose(getattr(blocks.profiles, what), getattr(p, what), rtol=tol, atol=tol)
    np.testing.assert_allclose(blocks.sinks.first_token_mass, sinks.first_token_mass, rtol=tol, atol=tol)
    record = json.loads(json.dumps(result.to_dict()))
    for name in ("mean_distance", "toeplitz_r2", "first_token_mass", "distance_without_first", "first_token_ratio"):
        assert [len(row) for row in record[name]] == counts.tolist(), name
        assert all(v is not None for row in record[name] for v in row), name
    words = [t.get_text() for ax in profile_grid(result, 0).axes for t in ax.texts]
    assert sum("no such head" in w for w in words) == result.n_heads - counts[0]
    for chart in (mean_distance_chart(result), sink_chart(result)):
        assert sum(t.get_text() == "—" for ax in chart.axes for t in ax.texts) == (~present).sum()
    capsys.readouterr()
    _print(result, {"npz": "attention.npz"})
    assert "no such head" in capsys.readouterr().out


@pytest.mark.slow
def test_differential_attention_is_recorded_once_per_layer_in_blocks_too():
    """DiffLlama runs its H softmax heads twice per layer (the same queries, keys and mask, one call per half of its
    values): both routes record each layer once, and blocks of query rows give the whole matrices' numbers."""
    model = make("diffllama")
    corpus = [[5, *ids] for ids in texts(6, seed=7)]
    runs = [
        attention_profiles(model, input_ids=corpus, special_ids=[5], max_length=13, batch_size=3,
                           weights_correlation=False, block_size=size)
        for size in (0, 4)
    ]  # fmt: skip
    for what in PROFILE_ARRAYS:
        np.testing.assert_allclose(getattr(runs[1].profiles, what), getattr(runs[0].profiles, what), atol=1e-9)
    np.testing.assert_allclose(runs[1].sinks.first_token_mass, runs[0].sinks.first_token_mass, atol=1e-9)
    assert np.isfinite(runs[0].profiles.mean_distance).all()


def brute_force_per_head(model, corpus, n: int) -> dict:
    """SPEC §10 profiles and SPEC §14 sinks by loops over each text alone where every head has pairs of its own
    (`alone(per_head=True)`): every count and reference per head, each head over the keys it may see; the first
    token of every text special, every token counted."""
    L, H = model.config.get_text_config().num_hidden_layers, model.config.get_text_config().num_attention_heads
    z = lambda *shape: np.zeros(shape)  # noqa: E731
    s_sum, a_sum, c, a_later, c_later = (z(L, H, 2 * n - 1) for _ in range(5))
    union = z(L, 2 * n - 1)
    dist, queries, first, first_n, uniform_first, special = z(L, H), z(L, H), z(L, H), z(L, H), z(L, H), z(L, H)
    later_dist, later_n, uniform, uniform_n, uniform_later, uniform_later_n = (z(L, H) for _ in range(6))
    sink_queries = 0
    for ids in corpus:
        ref = alone(model, ids, per_head=True)
        S, A, allowed = ref["scores"], ref["probs"], ref["allowed"]  # allowed (L, H, m, m)
        m = len(ids)
        sink_queries += m - 1
        for layer, h, i in np.ndindex(L, H, m):
            keys = [j for j in range(m) if allowed[layer, h, i, j]]
            for j in range(m):
                if allowed[layer, :, i, j].any() and h == 0:
                    union[layer, j - i + n - 1] += 1
            if keys:
                queries[layer, h] += 1
                uniform[layer, h] += np.mean([abs(j - i) for j in keys])
                uniform_n[layer, h] += 1
            for j in keys:
                c[layer, h, j - i + n - 1] += 1
                s_sum[layer, h, j - i + n - 1] += S[layer, h, i, j]
                a_sum[layer, h, j - i + n - 1] += A[layer, h, i, j]
                dist[layer, h] += A[layer, h, i, j] * abs(j - i)
            if i == 0:
                continue
            special[layer, h] += A[layer, h, i, 0]  # token 5 first: the one special token
            later = [j for j in keys if j >= 1]
            for j in later:
                c_later[layer, h, j - i + n - 1] += 1
                a_later[layer, h, j - i + n - 1] += A[layer, h, i, j]
            if allowed[layer, h, i, 0]:
                first[layer, h] += A[layer, h, i, 0]
                first_n[layer, h] += 1
                uniform_first[layer, h] += 1 / len(keys)
            mass = sum(A[layer, h, i, j] for j in later)
            if later and mass > 0:
                later_dist[layer, h] += sum(A[layer, h, i, j] * abs(j - i) for j in later) / mass
                later_n[layer, h] += 1
            if later:
                uniform_later[layer, h] += np.mean([abs(j - i) for j in later])
                uniform_later_n[layer, h] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return dict(
            score_profiles=s_sum / c, prob_profiles=a_sum / c, head_pair_counts=c, pair_counts=union,
            mean_distance=dist / queries, prob_profiles_without_first=a_later / c_later,
            first_token_mass=first / first_n, first_token_queries=first_n,
            uniform_first_token_mass=uniform_first / first_n,
            special_token_mass=special / sink_queries, distance_without_first=later_dist / later_n,
            uniform_distance=uniform / uniform_n, uniform_distance_without_first=uniform_later / uniform_later_n,
        )  # fmt: skip


@pytest.mark.slow
def test_heads_with_key_blocks_of_their_own_equal_loops_over_each_text(capsys):
    """MiniMax M3 (tiny): in its sparse layers each query head attends the key blocks its key-head group's indexer
    picked. Profiles, distances, sinks and their uniform references, each head over its own pairs, equal loops over
    the model's own eager attention (each text alone), on whole matrices and in blocks of query rows; the heads of a
    sparse layer do attend different pairs; JSON, figures and the text table take the per-head references."""
    import json

    from posprobe.cli.attention import _print
    from posprobe.plotting.attention import mean_distance_chart, sink_chart

    model = make("minimax_m3_vl_text")
    corpus = [[5, *ids] for ids in texts(6, seed=7)]
    n = 13
    ref = brute_force_per_head(copy.deepcopy(model), corpus, n)
    c = ref["head_pair_counts"]
    assert (c[1:] != c[1:, :1]).any() and (c[0] == c[0, :1]).all()  # sparse layers: pairs per head
    tol = tolerance("minimax_m3_vl_text")
    for size in (0, 5):
        result = attention_profiles(model, input_ids=corpus, special_ids=[5], max_length=n, batch_size=3,
                                    weights_correlation=False, block_size=size)  # fmt: skip
        p, sinks = result.profiles, result.sinks
        np.testing.assert_array_equal(p.head_pair_counts, ref["head_pair_counts"])
        np.testing.assert_array_equal(p.pair_counts, ref["pair_counts"])
        for what in ("score_profiles", "prob_profiles", "mean_distance", "prob_profiles_without_first"):
            np.testing.assert_allclose(getattr(p, what), ref[what], rtol=tol, atol=tol, err_msg=what)
        for what in ("first_token_mass", "special_token_mass", "distance_without_first", "uniform_first_token_mass",
                     "first_token_queries", "uniform_distance", "uniform_distance_without_first"):  # fmt: skip
            np.testing.assert_allclose(getattr(sinks, what), ref[what], rtol=tol, atol=tol, err_msg=what)
    record = json.loads(json.dumps(result.to_dict()))
    assert len(record["uniform_distance"][1]) == result.n_heads and None not in sum(record["mean_distance"], [])
    mean_distance_chart(result), sink_chart(result)
    capsys.readouterr()
    _print(result, {"npz": "attention.npz"})
    assert "L2" in capsys.readouterr().out


def test_the_sink_rate_is_the_share_of_the_heads_a_layer_has():
    from posprobe.analysis.sinks import sink_rate

    nan = np.nan
    mass = np.array([[0.5, 0.1, nan, nan], [0.5, 0.1, 0.4, 0.2], [nan] * 4, [0.5, nan, 0.4, 0.2]])
    np.testing.assert_array_equal(sink_rate(mass, 0.3), [0.5, 0.5, nan, 2 / 3])


@pytest.mark.parametrize("name", _params(sorted(REFUSED), quick={"falcon-alibi", "longformer"}))
def test_families_the_capture_does_not_reproduce_are_refused(name):
    model = make(name).float()
    previous = model.config._attn_implementation
    with pytest.raises(PosprobeError, match=REFUSED[name]):
        capture(model, [Keep()], input_ids=texts(3), max_length=16)
    assert model.config._attn_implementation == previous  # restored
    family = family_for_type(model.config.model_type)
    assert family.capture == REFUSED_ROUTE or "refused" in family.capture_note  # as the family table says


PADDED = ("reformer", "reformer-masked")  # padded to a multiple of its chunk lengths, hidden states of that length


@pytest.mark.parametrize("name", _params(POOLED + PADDED))
def test_hidden_states_of_a_model_that_pools_the_sequence_are_refused(name):
    hidden = Keep()
    hidden.needs = ("hidden_states",)
    why = r"pads its \d+ positions to \d+ .a multiple of its chunk lengths" if name in PADDED else "pools the sequence"
    with pytest.raises(PosprobeError, match=f"hidden states of other lengths than its input.*{why}") as err:
        capture(build(name).float(), [hidden], input_ids=texts(3), max_length=16)
    assert "\n" not in str(err.value)


def test_a_funnel_batch_too_short_for_its_pooled_blocks_is_refused_in_one_line():
    """transformers' Funnel (separate_cls) fails on 2 tokens; a batch of 2 is refused in one line, while the same
    text padded beside a longer one is recorded (its first block attends the text's own keys only)."""
    model = build("funnel")
    with pytest.raises(PosprobeError, match="fails in its own forward pass on a batch of 2 tokens") as err:
        capture(model, [Keep(hidden=False)], input_ids=[[7, 8]], max_length=16)
    assert "\n" not in str(err.value)
    kept = []
    for other in ([9, 10, 11, 12], [13, 14, 15, 16, 17, 18, 19]):  # padded to 4, then to 7
        keep = Keep(hidden=False)
        capture(model, [keep], input_ids=[[7, 8], other], max_length=16, batch_size=2)
        kept.append(keep.texts[0]["probs"])
    assert kept[0].shape == (3, 4, 2, 2) and np.allclose(kept[0].sum(-1), 1)
    np.testing.assert_allclose(kept[0], kept[1], rtol=1e-9, atol=1e-9)  # the padding beside it changes nothing


@pytest.mark.slow
def test_a_funnel_without_its_decoder_lists_its_later_blocks_and_reads_its_first_blocks_weights(tmp_path):
    """FunnelBaseModel (no upsampling decoder): posprobe's layers are its blocks' layers, no decoder's; the first
    block's probabilities equal its own eager run on each text alone; `layer_kind_words` says why the later ones have
    no score; from a checkpoint, the weights-based profiles are the first block's content-free scores, NaN after it."""
    from posprobe.capture.model import layer_kind_words
    from posprobe.families.windows import NO_SCORE

    torch.manual_seed(0)
    config = tf.FunnelConfig(**case("funnel").config)  # block_sizes [3, 1]
    model = tf.FunnelBaseModel(config).double().eval()
    corpus = [ids for ids in texts() if len(ids) > 2]  # transformers' Funnel fails on 2 tokens
    keep = Keep(hidden=False)
    summary = capture(model, [keep], input_ids=corpus, max_length=16, batch_size=3)
    assert summary.n_layers == sum(config.block_sizes) == 4 and list(summary.attention_layers) == [0, 1, 2]
    for index, ids in enumerate(corpus):
        ref = alone_pooled(copy.deepcopy(model), ids)
        assert ref["layers"] == summary.n_layers
        np.testing.assert_allclose(keep.texts[index]["probs"], ref["probs"], rtol=1e-6, atol=1e-6)
    words = layer_kind_words(model, 16)
    assert [NO_SCORE in w for w in words] == [False, False, False, True] and "decoder" not in words[-1]
    model.float().save_pretrained(tmp_path)
    result = attention_profiles(str(tmp_path), input_ids=[[5, *ids] for ids in corpus], max_length=13, batch_size=3)
    w = result.weights_profiles  # (L, H, 2n - 1)
    assert w.shape[0] == 4 and np.isfinite(w[:3]).all() and np.isnan(w[3]).all()
    assert result.layer_kinds == layer_kind_words(model, 13) and result.attention_layers == [0, 1, 2]


def hidden_states_per_text(model, corpus: list[list[int]], batch_size: int) -> dict:
    """{text index: its hidden states (L + 1 arrays (n, d), its real positions)} of a capture that records hidden
    states alone, in batches of `batch_size` of at most 16 tokens."""
    got = {}

    class Hidden:
        needs = ("hidden_states",)

        def add(self, batch):
            for row, text in enumerate(batch.text_ids.tolist()):
                got[text] = [h[row, : len(corpus[text])].double().numpy() for h in batch.hidden_states]

        def result(self):
            return None

    capture(model, [Hidden()], input_ids=corpus, max_length=16, batch_size=batch_size)
    return got


@pytest.mark.parametrize("name", _params([n for n in [*sorted(set(REFUSED) - set(POOLED + PADDED)), "t5", "bloom",
                                                      *HYBRIDS]
                                          if n not in NO_HIDDEN_STATES | STREAMS], quick={"t5", "lfm2"}))  # fmt: skip
def test_hidden_states_alone_for_refused_and_eager_families(name):
    """Without attention nothing is recorded: hidden states are the model's own (its default attention, whatever
    it is; an encoder-decoder's encoder; every layer of a hybrid), each text as if run alone."""
    model = make(name).float()
    corpus = texts(4)
    got = hidden_states_per_text(model, corpus, batch_size=2)
    net = stack_to_run(model)
    for index, ids in enumerate(corpus):
        with torch.no_grad():
            theirs = net(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        assert len(got[index]) == len(theirs) == model.config.get_text_config().num_hidden_layers + 1
        for ours, ref in zip(got[index], theirs, strict=True):
            np.testing.assert_allclose(ours, ref[0].double().numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", _params(sorted(STACKED)))
def test_hidden_states_of_stacks_over_bytes_and_patches_are_refused(name):
    hidden = Keep()
    hidden.needs = ("hidden_states",)
    with pytest.raises(PosprobeError, match=STACKED[name]) as err:
        capture(make(name).float(), [hidden], input_ids=texts(3), max_length=16)
    assert "\n" not in str(err.value)
    from posprobe.pipelines.states import states

    with pytest.raises(PosprobeError, match=STACKED[name]):  # `posprobe states`, before it reads a hidden size
        states(make(name).float(), input_ids=texts(3), max_length=16, min_texts=1)


def _blt_with_entropy_patches():
    """The BLT case with its entropy model in the forward pass (transformers' default, `patch_in_forward`), the
    threshold in the widest gap between the test texts' byte entropies around their median, so that its patches have
    several lengths and no entropy sits on the threshold (where a padded batch's round-off, which differs from CPU to
    CPU, could flip a patch boundary)."""
    base = make("blt")
    config = copy.deepcopy(base.config)
    config.patch_in_forward, config.patching_mode = True, "entropy"
    torch.manual_seed(2)
    model = tf.BltModel._from_config(config, attn_implementation="eager").to(torch.float32).eval()
    missing = model.load_state_dict(base.state_dict(), strict=False).missing_keys
    assert missing and all(key.startswith("patcher.") for key in missing)
    with torch.no_grad():
        entropies = [model.patcher(torch.tensor([ids]))[0][0, 1:] for ids in texts()]
    values = torch.cat(entropies).double().sort().values
    middle = range(len(values) // 4, 3 * len(values) // 4)
    widest = max(middle, key=lambda i: float(values[i + 1] - values[i]))
    model.config.patching_threshold = float(values[widest] + values[widest + 1]) / 2
    return model


@pytest.mark.slow
def test_blt_with_its_entropy_model_records_each_text_as_if_run_alone():
    """BLT with its entropy model picking the patches: a padded batch's byte layers (the decoder's depend on the
    patches, through its cross-attention) equal each text run alone; the patches have several lengths, and one patch
    per byte gives the decoder other probabilities. In float64 transformers' eager BLT gives NaN: refused."""
    model = _blt_with_entropy_patches()
    reference = copy.deepcopy(model)
    corpus = texts()
    with torch.no_grad():
        lengths = model.patcher(torch.tensor([corpus[0]]), patch_size=4, threshold=model.config.patching_threshold)[1]
    assert (lengths > 1).any() and len(lengths[lengths > 0]) < len(corpus[0])  # patches of several bytes
    keep = Keep(hidden=False)
    summary = capture(model, [keep], input_ids=corpus, max_length=16, batch_size=3)
    assert summary.attention_layers == (0, 1, 3, 4, 5) and summary.n_batches == 3
    assert model.config.use_cache is True  # off while it ran (its cache wants a layer count), restored
    for index, ids in enumerate(corpus):
        got, ref = keep.texts[index], alone_stacked(reference, ids)
        np.testing.assert_allclose(got["probs"], ref["probs"], rtol=2e-5, atol=2e-5, err_msg=f"text {index}")
        np.testing.assert_array_equal(got["allowed"], ref["allowed"])
    one_per_byte = alone_stacked(make("blt"), corpus[0])["probs"]
    assert np.abs(one_per_byte[2:] - alone_stacked(reference, corpus[0])["probs"][2:]).max() > 1e-3  # the decoder
    np.testing.assert_array_equal(one_per_byte[:2], alone_stacked(reference, corpus[0])["probs"][:2])  # the encoder
    with pytest.raises(PosprobeError, match="non-finite outputs on real tokens .* in float64") as err:
        capture(model.double(), [Keep(hidden=False)], input_ids=corpus, max_length=16, batch_size=3)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_blt_byte_stacks_of_two_head_counts_are_refused_in_one_line():
    """The capture keeps one head count for every layer: a byte decoder of other heads than the byte encoder is
    refused before any text runs."""
    config = copy.deepcopy(make("blt").config)
    config.decoder_config.num_attention_heads = 2
    model = tf.BltModel(config).float().eval()
    with pytest.raises(PosprobeError, match=r"other head counts \(\[2, 4\]\)") as err:
        capture(model, [Keep(hidden=False)], input_ids=texts(3), max_length=16)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", _params(sorted(NOT_TEXT)))
def test_models_without_one_token_sequence_are_refused(name):
    """Texts (one token per position) cannot be run through a model that reads one token of each codebook at every
    position: refused in one line, hidden states too, rather than read as codebooks."""
    model = make(name)
    for needs in (("scores", "probs"), ("hidden_states",)):
        reducer = Keep()
        reducer.needs = needs
        with pytest.raises(PosprobeError, match="one token of each codebook at every position") as err:
            capture(model, [reducer], input_ids=texts(3), max_length=16)
        assert "\n" not in str(err.value)
    assert family_for_type(model.config.model_type).capture == REFUSED_ROUTE


def test_a_model_whose_own_forward_fails_on_text_is_refused_in_one_line():
    """transformers' own code failing on a text alone (as Llama 4's wrapper once did: it read image outputs its
    language model does not return) is one line naming the model type, not a traceback; here a tiny Llama whose
    final norm raises the AttributeError such code raises."""
    model = build("llama").float()

    def fails(*args, **kwargs):
        raise AttributeError("'NoneType' object has no attribute 'image_hidden_states'")

    model.norm.forward = fails
    for needs in (("scores", "probs"), ("hidden_states",)):
        reducer = Keep()
        reducer.needs = needs
        with pytest.raises(PosprobeError, match="'llama' fails in its own forward pass on text") as err:
            capture(model, [reducer], input_ids=texts(3), max_length=16)
        assert "\n" not in str(err.value) and "image_hidden_states" in str(err.value)


def test_routes():
    assert is_eager_route(make("t5")) and is_eager_route(build("bloom"))
    assert not is_eager_route(build("llama"))


@pytest.mark.slow
def test_bigbird_full_attention_lengths_only_and_twice():
    """BigBird attends fully up to (5 + 2 random blocks) x block size (28 here) and block-sparsely beyond: longer
    inputs are refused for attention (not for hidden states); its attention type is restored after a run, and a
    second run (where transformers' BigBird returns no attentions) gives the same numbers from its softmax."""
    model = build("big_bird")
    long = [list(range(4, 40))]
    with pytest.raises(PosprobeError, match="block-sparsely .* beyond 28 tokens"):
        capture(model, [Keep()], input_ids=long, max_length=40)
    hidden = Keep()
    hidden.needs = ("hidden_states",)
    hidden.add = lambda batch: hidden.texts.update({0: batch.hidden_states})
    capture(model, [hidden], input_ids=long, max_length=40)  # block-sparse: hidden states only
    runs = [Keep(), Keep()]
    for keep in runs:
        capture(model, [keep], input_ids=texts(), max_length=16, batch_size=3)
        assert model.attention_type == "block_sparse"
    for index in range(len(texts())):
        for what in ("scores", "probs", "allowed"):
            np.testing.assert_array_equal(runs[0].texts[index][what], runs[1].texts[index][what])


# -- the command on checkpoints of the eager route -----------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint_folder(tmp_path_factory):
    """name -> folder of a tiny T5 or BLOOM checkpoint saved with an offline WordPiece tokenizer (65 words),
    written on first use."""
    root = tmp_path_factory.mktemp("eager-checkpoints")
    folders = {}

    def folder(name: str):
        if name not in folders:
            folders[name] = root / name
            make(name).float().save_pretrained(folders[name])
            word_tokenizer(60).save_pretrained(folders[name])
        return folders[name]

    return folder


@pytest.mark.parametrize("slow", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["t5", "t5-and-bloom"])
def test_cli_runs_an_encoder_decoders_encoder_and_refuses_its_decoder(checkpoint_folder, tmp_path, capsys, slow):
    import json

    from typer.testing import CliRunner

    from posprobe.cli import app, main

    texts_path = tmp_path / "texts.txt"
    rng = np.random.default_rng(3)
    texts_path.write_text("".join(" ".join(f"w{x}" for x in rng.integers(0, 60, 8)) + "\n" for _ in range(6)))
    for name, causal, stack in (("t5", False, "encoder"), ("bloom", True, None))[: 2 if slow else 1]:
        out = tmp_path / name
        args = ["attention", str(checkpoint_folder(name)), "--text", str(texts_path), "--max-length", "12"]
        run = CliRunner().invoke(app, [*args, "--min-pairs", "1", "--out", str(out), "--json"])
        assert run.exit_code == 0, run.output
        record = json.loads(run.stdout)
        assert record["stack"] == stack and record["causal"] is causal and record["n_texts"] == 6
        assert np.isfinite(np.array(record["mean_distance"], dtype=float)).all()
        assert np.isfinite(np.array(record["weights_correlation"], dtype=float)).all()
        assert "content-free" in record["weights_profile"]  # T5's bucket bias, BLOOM's ALiBi: SPEC §9 scores
        assert (out / "attention.npz").exists()
    capsys.readouterr()  # what writing the checkpoints printed
    with pytest.raises(SystemExit) as info:
        main(["attention", str(checkpoint_folder("t5")), "--text", str(texts_path), "--stack", "decoder",
              "--out", str(tmp_path / "never")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "\n" not in err and "runs the encoder stack" in err
    assert not (tmp_path / "never").exists()


@pytest.mark.slow
def test_cli_attention_on_a_hybrid_lists_its_other_layers(checkpoint_folder, tmp_path, capsys):
    """`posprobe attention` on a saved LFM2 (attention, convolution, attention): the table's convolution column is
    empty and a line names its kind; --json and the .npz metadata carry every layer's kind."""
    import json

    from posprobe.cli import main
    from posprobe.formats.writing import load_npz

    texts_path = tmp_path / "texts.txt"
    texts_path.write_text("".join(" ".join(f"w{x}" for x in range(i, i + 8)) + "\n" for i in range(6)))
    args = ["attention", str(checkpoint_folder("lfm2")), "--text", str(texts_path), "--max-length", "12"]
    capsys.readouterr()  # what writing the checkpoint printed
    assert main([*args, "--out", str(tmp_path / "text")]) in (0, None)
    shown = "".join(capsys.readouterr())
    assert "layer 1: no softmax attention, gated short-convolution layers (layer type 'conv'): no positional score" in (
        " ".join(shown.split())
    )
    assert "layer 0:" not in shown and "layer 2:" not in shown  # global rotary layers: nothing to add
    assert main([*args, "--out", str(tmp_path / "json"), "--json"]) in (0, None)
    record = json.loads(capsys.readouterr().out)
    assert record["attention_layers"] == [0, 2] and record["layer_kinds"][0] == "global"
    assert record["mean_distance"][1] == [None] * 4 and None not in record["mean_distance"][2]
    assert str(tmp_path / "json" / "attention_profiles_layer1.png") in record["figures"]
    meta, arrays = load_npz(tmp_path / "json" / "attention.npz")
    assert meta["layer_kinds"] == record["layer_kinds"] and np.isnan(arrays["mean_distance"][1]).all()
    assert (arrays["layer_pair_counts"][1] == 0).all() and (arrays["layer_pair_counts"][[0, 2]].sum(-1) > 0).all()
    # fit-tisa on the file: the convolution layer has nothing to fit (one line naming the layers that do)
    npz, fitted = str(tmp_path / "json" / "attention.npz"), tmp_path / "fit"
    with pytest.raises(SystemExit) as info:
        main(["fit-tisa", npz, "--kernels", "2", "--out", str(fitted)])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "\n" not in err and not fitted.exists()
    assert "layer 1 of" in err and "no positional score to fit" in err and err.endswith("pass --layers 0,2")
    assert main(["fit-tisa", npz, "--kernels", "2", "--layers", "0,2", "--out", str(fitted), "--json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["layers"] == [0, 2]


@pytest.mark.slow
def test_a_model_that_reads_padding_runs_texts_alone_and_refuses_padded_batches():
    """ConvBERT's span convolutions read the padding beside real tokens (transformers masks none), so a padded batch
    is not its texts alone: `capture` runs them one at a time (the test above), and a padded batch handed to
    `capture_batches` directly is refused in one line; an unpadded one runs."""
    from posprobe.capture.batches import pad_batch
    from posprobe.capture.run import capture_batches

    model = make("convbert")
    padded = pad_batch([(0, [5, 6, 7, 8], [0] * 4), (1, [9, 10], [0] * 2)], pad_id=0, exclude_special=False)
    with pytest.raises(PosprobeError) as err:
        capture_batches(model, [padded], [Keep()])
    assert "padding" in str(err.value) and "\n" not in str(err.value)
    same_length = pad_batch([(0, [5, 6, 7, 8], [0] * 4), (1, [9, 10, 11, 12], [0] * 4)], pad_id=0,
                            exclude_special=False)  # fmt: skip
    assert capture_batches(model, [same_length], [Keep()]).n_texts == 2


@pytest.mark.slow
def test_reformer_hidden_states_are_each_texts_own_where_it_does_not_pad():
    """Padding changes which keys Reformer's chunks and buckets see, so its texts run alone: a text of 8 tokens (two
    chunks of 4, each seeing the other as the chunk before and after it) next to texts of 16 (padded to 16 in a
    batch: four chunks, the first and last wrapping to padding) gets the hidden states it gets alone. Both lengths
    are multiples of its chunk lengths, so the model pads neither."""
    model = make("reformer-masked")
    rng = np.random.default_rng(0)
    corpus = [rng.integers(4, 99, size=16).tolist(), rng.integers(4, 99, size=8).tolist()] * 2
    got = hidden_states_per_text(model, corpus, batch_size=4)
    for index, ids in enumerate(corpus):
        with torch.no_grad():
            theirs = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        for ours, ref in zip(got[index], theirs, strict=True):
            np.testing.assert_allclose(ours, ref[0].double().numpy(), rtol=1e-9, atol=1e-9)


def neighbour_chunk_reference(model, ids: list[int]) -> dict:
    """Each local layer of Reformer on one text alone, computed from its own queries and keys: S = q k / sqrt(d_h)
    over the layer's padded length M (its input, hooked), on the pairs of query chunk a and key chunk b with b - a in
    {-before .. after} modulo the M / c chunks (all pairs where M <= c), real keys only (j < n), j <= i where
    is_decoder; A its softmax over them; both cut to the n real positions. Also each layer's output, and A V."""
    cfg, n = model.config, len(ids)
    c, before, after = cfg.local_attn_chunk_length, cfg.local_num_chunks_before, cfg.local_num_chunks_after
    layers = [layer for layer, kind in enumerate(cfg.attn_layers) if kind == "local"]
    seen, hooks = {}, []
    for layer in layers:
        module = model.get_submodule(f"encoder.layers.{layer}.attention.self_attention")
        hooks.append(module.register_forward_hook(
            lambda m, args, kwargs, out, layer=layer: seen.__setitem__(layer, (m, kwargs["hidden_states"], out)),
            with_kwargs=True))  # fmt: skip
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        for hook in hooks:
            hook.remove()
    out = dict(scores=[], probs=[], allowed=[], output=[], applied=[])
    for layer in layers:
        module, x, result = seen[layer]
        x, big = x[0].double(), x.shape[1]
        heads = cfg.num_attention_heads
        q, k, v = (getattr(module, w).weight.detach().double() for w in ("query", "key", "value"))
        q, k, v = ((x @ w.T).view(big, heads, -1).transpose(0, 1) for w in (q, k, v))  # (H, M, d_h)
        dots = (q @ k.transpose(-1, -2) / cfg.attention_head_size**0.5).numpy()
        i, j = np.arange(big)[:, None], np.arange(big)[None, :]
        chunks = max(big // c, 1)  # one chunk: every pair
        neighbours = [offset % chunks for offset in range(-before, after + 1)]  # chunk offsets, wrapping around
        pairs = np.ones((big, big), bool) if big <= c else np.isin((j // c - i // c) % chunks, neighbours)
        pairs &= j < n
        if cfg.is_decoder:
            pairs &= j <= i
        s = np.where(pairs, dots, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        out["scores"].append(s[:, :n, :n])
        out["probs"].append(a[:, :n, :n])
        out["allowed"].append(pairs[:n, :n])
        out["output"].append(result.hidden_states[0, :n].double().numpy())
        applied = torch.from_numpy(a[:, :n, :n]) @ v[:, :n]  # (H, n, d_h)
        out["applied"].append(applied.transpose(0, 1).reshape(n, -1).numpy())
    return {key: np.stack(value) for key, value in out.items()} | {"layers": layers, "padded": big}


# lengths: attended whole (<= 4: one chunk), padded to 16 (four chunks of 4, the last partly or wholly padding), 16
CHUNKED_TEXTS = [[7, 8, 9], [5, 6, 7, 8], [9, 8, 7, 6, 5, 4, 9, 8, 7], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20],
                 [40 + t for t in range(13)], [60 + t for t in range(16)]]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", CHUNKED)
def test_neighbour_chunk_attention_is_each_layers_own_rebuilt_over_the_texts_positions(name):
    """Reformer's local layers: the capture's (queries x keys) A, S and pairs equal each layer's softmax computed
    from its own queries and keys over the pairs of its chunk and neighbours (wrapping around, over the length the
    model pads to, real keys only, causal where is_decoder), each text alone; A times the layer's values is the
    layer's own output; its LSH layers are not recorded (summary.attention_layers: the local ones)."""
    model = make(name)
    keep = Keep(hidden=False)
    summary = capture(model, [keep], input_ids=CHUNKED_TEXTS, max_length=16, batch_size=3)
    assert summary.n_batches == len(CHUNKED_TEXTS)  # texts alone
    assert is_eager_route(model) and family_for_type(model.config.model_type).capture == EAGER  # as the table says
    for index, ids in enumerate(CHUNKED_TEXTS):
        got, ref = keep.texts[index], neighbour_chunk_reference(model, ids)
        assert list(summary.attention_layers) == ref["layers"] and len(ref["layers"]) < len(model.config.attn_layers)
        np.testing.assert_allclose(ref["applied"], ref["output"], rtol=1e-9, atol=1e-9)  # the reference is the layer
        np.testing.assert_array_equal(got["allowed"], ref["allowed"])
        np.testing.assert_allclose(got["probs"], ref["probs"], rtol=1e-9, atol=1e-9, err_msg=f"{name} text {index}")
        allowed = np.broadcast_to(ref["allowed"][:, None], got["scores"].shape)
        np.testing.assert_allclose(got["scores"][allowed], ref["scores"][allowed], rtol=1e-9, atol=1e-9)
        assert (got["scores"][~allowed] < -1e30).all()
        first = ref["allowed"][0][:4]  # the first chunk's queries: they see chunks 3 (wrapping around), 0 and 1
        if len(ids) in (9, 10):  # padded to 16: chunk 3 is padding, and chunk 2 (keys 8 ..) is out of reach
            assert not first[:, 8:].any() and (name == "reformer" or first[:, 4:8].all())
        if len(ids) == 13:  # chunk 3 holds key 12: seen by the first chunk of the masked LM, hidden by causality
            assert first[:, 12].all() == (name == "reformer-masked")


@pytest.mark.slow
def test_neighbour_chunk_lengths_that_count_keys_twice_are_refused():
    """A text of 6 tokens is padded to 8: two chunks of 4, whose one chunk before is its chunk after, so the layer
    counts those keys twice in its softmax: refused in one line, not rebuilt as a set of pairs."""
    with pytest.raises(PosprobeError, match="twice") as err:
        capture(make("reformer-masked"), [Keep(hidden=False)], input_ids=[[5, 6, 7, 8, 9, 10]], max_length=16)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_reformer_profiles_read_its_local_layers_and_list_its_lsh_layers_without_a_score():
    """`posprobe attention` on Reformer: its local layers' profiles are those of the rebuilt matrices (finite), its
    LSH layers hold NaN, count no pair and say why ('no positional score') in its layer kinds."""
    from posprobe.families.windows import NO_SCORE

    model = make("reformer")
    result = attention_profiles(model, input_ids=CHUNKED_TEXTS, max_length=16, batch_size=3, weights_correlation=False)
    local, lsh = [0, 2], [1]
    p = result.profiles
    assert result.attention_layers == local and (p.pair_counts[lsh] == 0).all() and (p.pair_counts[local] > 0).any()
    assert np.isnan(p.mean_distance[lsh]).all() and np.isfinite(p.mean_distance[local]).all()
    assert [NO_SCORE in kind for kind in result.layer_kinds] == [False, True, False]


@pytest.mark.slow
def test_reformer_lsh_attention_of_a_run_is_rebuilt_exactly_but_is_no_one_set_of_pairs_per_layer():
    """Why Reformer's LSH layers are listed, not recorded: from one run's buckets (hash rounds drawn afresh, no
    hash seed) its per-chunk probabilities, put back at their (query, key) positions and added where a key recurs,
    give that layer's output; but the pairs differ per head, and a key recurs up to 3 times over 2 hash rounds (the
    chunk before a round's first is the previous round's last): no one set of pairs per layer, as the capture holds."""
    from transformers.models.reformer.modeling_reformer import _stable_argsort

    from posprobe.capture.chunks import logsumexp_inputs

    torch.manual_seed(0)
    config = tf.ReformerConfig(**dict(CASES["reformer-masked"][1], num_hashes=2, hash_seed=None))
    model = tf.ReformerModel(config).double().eval()
    module, seen, dots = model.encoder.layers[0].attention.self_attention, {}, []
    module.register_forward_hook(lambda m, args, kwargs, out: seen.update(x=kwargs["hidden_states"], out=out),
                                 with_kwargs=True)  # fmt: skip
    with torch.no_grad(), logsumexp_inputs(dots.append):
        model(input_ids=torch.arange(5, 37)[None])  # 32 tokens: four LSH chunks of 8 per round
    x, out, heads, m = seen["x"], seen["out"], config.num_attention_heads, 32
    order = _stable_argsort(out.buckets.reshape(1, heads, -1), -1) % m  # each round's positions, sorted by bucket
    queries = order.view(1, heads, -1, config.lsh_attn_chunk_length)  # (1, H, rounds x chunks, chunk)
    keys = torch.cat([queries.roll(1, 2), queries], dim=-1)  # the chunk before (lsh_num_chunks_before 1) and its own
    d = dots[0]  # (1, H, rounds x chunks, chunk, 2 chunk): the layer's scores, the first logsumexp it takes
    slots = (queries[..., None] * m + keys[:, :, :, None, :]).expand(d.shape).reshape(1, heads, -1)
    a = torch.zeros(1, heads, m * m, dtype=torch.float64).scatter_add_(-1, slots, d.exp().reshape(1, heads, -1))
    a = (a / a.view(1, heads, m, m).sum(-1).repeat_interleave(m, -1)).view(1, heads, m, m)
    values = module.value(x).detach().view(1, m, heads, -1).transpose(1, 2)
    np.testing.assert_allclose((a @ values).transpose(1, 2).reshape(1, m, -1), out.hidden_states, atol=1e-12)
    pairs = a[0] > 0
    assert not all(torch.equal(pairs[0], pairs[h]) for h in range(heads))  # each head its own pairs
    recurs = torch.zeros(1, heads, m * m).scatter_add_(-1, slots, torch.ones(slots.shape))  # slots per pair
    assert recurs.max() == 3
