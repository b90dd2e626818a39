"""Edits (SPEC §20): each kind equals a plain transformers reference built here with forward hooks, position ids
and 4D attention masks (never posprobe's code), on the loss by position of `posprobe context`, to 1e-4 nats: a tiny
random Llama, a tiny Gemma 3 (local and global layers), a tiny BERT (attend, head, channel; its masked-LM loss at
every position); `shift:1000` on rotary equals no edit to round-off; hostile edits get one line, exit 2, nothing
written."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import posprobe

LENGTH, WINDOWS, BOS, EOS = 16, 2, 2, 3
TOL = 1e-4


def tiny_llama():
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=37, vocab_size=99, max_position_embeddings=64, bos_token_id=BOS,
                            eos_token_id=EOS)  # fmt: skip
    return _sharpen(tf.LlamaForCausalLM(config).eval())


def tiny_gemma3():
    import transformers as tf

    torch.manual_seed(0)
    config = tf.Gemma3TextConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 head_dim=8, intermediate_size=37, vocab_size=99, max_position_embeddings=64,
                                 layer_types=["sliding_attention", "full_attention"], sliding_window=5,
                                 bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0)  # fmt: skip
    return _sharpen(tf.Gemma3ForCausalLM(config).eval())


def _sharpen(model):
    """Larger random weights, so that every edit moves the loss well past the tolerance."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    return model


def documents(count: int = 12, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(5, 99, size=rng.integers(8, 20))] for _ in range(count)]


def windows_of(docs) -> torch.Tensor:
    """(WINDOWS, LENGTH): a BOS, then consecutive tokens of the documents joined by EOS (SPEC §17)."""
    stream = [x for i, d in enumerate(docs) for x in ([EOS] if i else []) + d]
    step = LENGTH - 1
    return torch.tensor([[BOS] + stream[k * step : (k + 1) * step] for k in range(WINDOWS)])


def position_loss(model, ids, **kwargs) -> np.ndarray:
    """(LENGTH - 1,) mean over windows of -log p(x[t+1] | x[..t]), float64, from one plain forward pass."""
    with torch.no_grad():
        logits = model(input_ids=ids, **kwargs).logits.double()
    nll = -torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return nll.mean(0).numpy()


class hooked:
    """Forward hooks (and pre-hooks) installed while entered."""

    def __init__(self, *hooks):
        self.hooks, self.handles = hooks, []

    def __enter__(self):
        for module, fn, pre in self.hooks:
            self.handles.append(module.register_forward_pre_hook(fn) if pre else module.register_forward_hook(fn))

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()


def eager(model):
    model.set_attn_implementation("eager")
    return model


def additive(allowed: torch.Tensor) -> torch.Tensor:
    """(1, 1, m, m) additive mask of an allowed (m, m) bool matrix."""
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]


def causal(m: int) -> torch.Tensor:
    i, j = torch.arange(m)[:, None], torch.arange(m)[None]
    return j <= i


def attend_allowed(m: int, sinks: int, window: int, bidirectional: bool = False) -> torch.Tensor:
    i, j = torch.arange(m)[:, None], torch.arange(m)[None]
    near = (i - j).abs() < window if bidirectional else (j <= i) & (j > i - window)
    return near | (j < sinks) if bidirectional else (near | (j < sinks)) & (j <= i)


def head_pre_hook(heads: list[int], d_h: int, fill=None):
    """Pre-hook on an output projection: the inputs of `heads` (their outputs) set to 0 or to `fill` (H, d_h)."""

    def fn(module, args):
        x = args[0].clone()
        for h in heads:
            x[..., h * d_h : (h + 1) * d_h] = 0 if fill is None else fill[h].to(x.dtype)
        return (x,)

    return fn


def output_means(model, module, ids, pre: bool) -> torch.Tensor:
    """The mean over every token of `ids` of a module's input (pre) or output, from a plain pass."""
    seen = []

    def keep(mod, args, output=None):
        x = args[0] if pre else (output[0] if isinstance(output, tuple) else output)
        seen.append(x.detach().double().reshape(-1, x.shape[-1]))

    handle = module.register_forward_pre_hook(keep) if pre else module.register_forward_hook(keep)
    with torch.no_grad():
        model(input_ids=ids)
    handle.remove()
    return torch.cat(seen).mean(0)


def channel_hook(channels: list[int], values=None):
    def fn(module, args, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        for k, c in enumerate(channels):
            hidden[..., c] = 0 if values is None else values[k].to(hidden.dtype)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    return fn


def qk_pair_hook(dims: list[int], d_h: int):
    """Forward hook on a q or k projection: dims `dims` of every head set to 0 (before rotation)."""

    def fn(module, args, output):
        out = output.clone().unflatten(-1, (-1, d_h))
        out[..., dims] = 0
        return out.flatten(-2)

    return fn


def rope_keep_hook(fraction: float, pairs: int):
    """Forward hook on a rotary module (cos, sin) (B, m, 2 n), rotate-half: the pairs past the round(P n) first
    (highest frequencies, inv_freq decreasing) unrotated: cos 1, sin 0."""
    kept = int(np.floor(fraction * pairs + 0.5))

    def fn(module, args, output):
        cos, sin = (x.clone() for x in output)
        for f in range(kept, pairs):
            cos[..., [f, f + pairs]] = 1.0
            sin[..., [f, f + pairs]] = 0.0
        return cos, sin

    return fn


def run_context(model, docs, edits):
    return posprobe.context(model, [LENGTH], documents=docs, windows=WINDOWS, bos_id=BOS, edits=edits)


def _reference(model, ids, kind: str):
    """The reference loss by position of edit `kind` on a Llama-like model (layers model.model.layers, Q/K/O
    projections, rotary module model.model.rotary_emb, head size 8, 4 pairs), `ids` its windows."""
    layers = model.model.layers
    d_h = 8
    if kind == "head:1.2":
        with hooked((layers[1].self_attn.o_proj, head_pre_hook([2], d_h), True)):
            return position_loss(model, ids)
    if kind == "head:*.1,3=mean":
        means = [
            output_means(model, layer.self_attn.o_proj, ids, pre=True).unflatten(-1, (-1, d_h)) for layer in layers
        ]
        hooks = [(layer.self_attn.o_proj, head_pre_hook([1, 3], d_h, means[k]), True) for k, layer in enumerate(layers)]
        with hooked(*hooks):
            return position_loss(model, ids)
    if kind == "band:*.0-1":
        hooks = [(getattr(layer.self_attn, p), qk_pair_hook([0, 1, 4, 5], d_h), False)
                 for layer in layers for p in ("q_proj", "k_proj")]  # fmt: skip
        with hooked(*hooks):
            return position_loss(model, ids)
    if kind == "band:1.3":
        hooks = [(getattr(layers[1].self_attn, p), qk_pair_hook([3, 7], d_h), False) for p in ("q_proj", "k_proj")]
        with hooked(*hooks):
            return position_loss(model, ids)
    if kind == "rope-keep:0.5":
        with hooked((model.model.rotary_emb, rope_keep_hook(0.5, 4), False)):
            return position_loss(model, ids)
    if kind == "shift:7":
        positions = torch.arange(ids.shape[1])[None].expand_as(ids) + 7
        return position_loss(model, ids, position_ids=positions)
    if kind == "channel:0.5,9":
        with hooked((layers[0], channel_hook([5, 9]), False)):
            return position_loss(model, ids)
    if kind == "channel:1.4=mean":
        mean = output_means(model, layers[1], ids, pre=False)
        with hooked((layers[1], channel_hook([4], mean[[4]]), False)):
            return position_loss(model, ids)
    raise AssertionError(kind)


LLAMA_EDITS = ["head:1.2", "head:*.1,3=mean", "band:*.0-1", "band:1.3", "rope-keep:0.5", "shift:7", "channel:0.5,9",
               "channel:1.4=mean"]  # fmt: skip


@pytest.mark.parametrize("edit", LLAMA_EDITS)
def test_each_edit_equals_a_hooked_transformers_reference_on_llama(edit):
    model, docs = tiny_llama(), documents()
    ids = windows_of(docs)
    ours = run_context(model, docs, [edit]).position_loss[0]
    plain = position_loss(model, ids)
    reference = _reference(eager(model), ids, edit)
    np.testing.assert_allclose(ours, reference, atol=TOL, rtol=0)
    assert np.abs(reference - plain).max() > 10 * TOL or edit.startswith("shift")  # the edit does something


def test_attend_equals_a_4d_mask_and_edits_combine_on_llama():
    """attend:S,W equals the additive 4D mask of j < S or i - W < j <= i; with a head edit beside it, both apply."""
    model, docs = tiny_llama(), documents()
    ids = windows_of(docs)
    for sinks, window in ((0, 4), (2, 3), (1, 1)):
        ours = run_context(model, docs, [f"attend:{sinks},{window}"]).position_loss[0]
        mask = additive(attend_allowed(LENGTH, sinks, window)).expand(WINDOWS, 1, -1, -1)
        reference = position_loss(eager(model), ids, attention_mask=mask)
        np.testing.assert_allclose(ours, reference, atol=TOL, rtol=0)
    both = run_context(model, docs, ["attend:2,3", "head:0.1"]).position_loss[0]
    mask = additive(attend_allowed(LENGTH, 2, 3)).expand(WINDOWS, 1, -1, -1)
    with hooked((model.model.layers[0].self_attn.o_proj, head_pre_hook([1], 8), True)):
        reference = position_loss(eager(model), ids, attention_mask=mask)
    np.testing.assert_allclose(both, reference, atol=TOL, rtol=0)


def test_shift_1000_on_rotary_equals_no_edit():
    """Rotary attention depends on i - j alone: every position + 1000 leaves the loss unchanged to round-off."""
    model, docs = tiny_llama(), documents()
    plain = run_context(model, docs, None).position_loss[0]
    shifted = run_context(model, docs, ["shift:1000"])
    np.testing.assert_allclose(shifted.position_loss[0], plain, atol=1e-4, rtol=0)
    assert shifted.edits == ["shift:1000"]


def test_gemma3_local_and_global_layers():
    """Gemma 3 with a sliding layer (window 5) and a global one: attend intersects each layer's own mask (a mask per
    layer type), head and band edits act on both kinds of layer, rope-keep on each type's own frequencies."""
    model, docs = tiny_gemma3(), documents()
    ids = windows_of(docs)
    layers = model.model.layers
    d_h = 8
    sliding = causal(LENGTH) & (torch.arange(LENGTH)[None] > torch.arange(LENGTH)[:, None] - 5)
    attend = attend_allowed(LENGTH, 2, 3)
    masks = {"full_attention": additive(causal(LENGTH) & attend).expand(WINDOWS, 1, -1, -1),
             "sliding_attention": additive(sliding & attend).expand(WINDOWS, 1, -1, -1)}  # fmt: skip
    ours = run_context(model, docs, ["attend:2,3"]).position_loss[0]
    np.testing.assert_allclose(ours, position_loss(eager(model), ids, attention_mask=masks), atol=TOL, rtol=0)

    ours = run_context(model, docs, ["head:0.1,1.2"]).position_loss[0]
    with hooked((layers[0].self_attn.o_proj, head_pre_hook([1], d_h), True),
                (layers[1].self_attn.o_proj, head_pre_hook([2], d_h), True)):  # fmt: skip
        np.testing.assert_allclose(ours, position_loss(eager(model), ids), atol=TOL, rtol=0)

    ours = run_context(model, docs, ["band:*.0"]).position_loss[0]

    def zero_pair(module, args, output):  # Gemma 3 normalises each head's q and k before rotating: after its norm
        out = output.clone()
        out[..., [0, 4]] = 0
        return out

    hooks = [(getattr(layer.self_attn, p), zero_pair, False) for layer in layers for p in ("q_norm", "k_norm")]
    with hooked(*hooks):
        np.testing.assert_allclose(ours, position_loss(eager(model), ids), atol=TOL, rtol=0)

    ours = run_context(model, docs, ["rope-keep:0.25"]).position_loss[0]

    def keep_one(module, args, output):  # every layer type: pair 0 (the highest frequency) keeps its rotation
        cos, sin = (x.clone() for x in output)
        cos[..., [1, 2, 3, 5, 6, 7]] = 1.0
        sin[..., [1, 2, 3, 5, 6, 7]] = 0.0
        return cos, sin

    with hooked((model.model.rotary_emb, keep_one, False)):
        np.testing.assert_allclose(ours, position_loss(eager(model), ids), atol=TOL, rtol=0)

    ours = run_context(model, docs, ["channel:1.3=mean"]).position_loss[0]
    mean = output_means(model, layers[1], ids, pre=False)
    with hooked((layers[1], channel_hook([3], mean[[3]]), False)):
        np.testing.assert_allclose(ours, position_loss(eager(model), ids), atol=TOL, rtol=0)


def test_bert_attend_head_and_channel():
    """A bidirectional model (BERT, masked-LM loss of every token at its own position): attend:S,W is the 4D mask
    |i - j| < W or j < S, head and channel edits the hooks; applied through `posprobe.edits.EditRun` on the kernel."""
    import transformers as tf

    from posprobe.edits import parse_edits
    from posprobe.edits.apply import EditRun, MeanPass
    from posprobe.kernel import SDPA, register

    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=37, max_position_embeddings=64)  # fmt: skip
    model = _sharpen(tf.BertForMaskedLM(config).eval())
    ids = windows_of(documents())
    layers = model.bert.encoder.layer

    def ours(edits):
        edits = parse_edits(edits)
        means = None
        register()
        model.set_attn_implementation(SDPA)
        try:
            with MeanPass(model, edits) as collect, torch.no_grad():
                (collect.taps.forward(model, input_ids=ids) if collect.taps else model(input_ids=ids))
            means = collect.means()
            with EditRun(model, edits, means) as run, torch.no_grad():
                logits = (run.taps.forward(model, input_ids=ids) if run.taps else model(input_ids=ids)).logits
        finally:
            model.set_attn_implementation("eager")
        return -torch.log_softmax(logits.double(), -1).gather(-1, ids[..., None])[..., 0].mean(0).numpy()

    def mlm_loss(**kwargs):
        with torch.no_grad():
            logits = model(input_ids=ids, **kwargs).logits.double()
        return -torch.log_softmax(logits, -1).gather(-1, ids[..., None])[..., 0].mean(0).numpy()

    mask = additive(attend_allowed(LENGTH, 1, 3, bidirectional=True)).expand(WINDOWS, 1, -1, -1)
    np.testing.assert_allclose(ours(["attend:1,3"]), mlm_loss(attention_mask=mask), atol=TOL, rtol=0)
    with hooked((layers[1].attention.output.dense, head_pre_hook([0, 3], 8), True)):
        np.testing.assert_allclose(ours(["head:1.0,3"]), mlm_loss(), atol=TOL, rtol=0)
    mean = output_means(model, layers[0].attention.output.dense, ids, pre=True).unflatten(-1, (-1, 8))
    with hooked((layers[0].attention.output.dense, head_pre_hook([2], 8, mean), True)):
        np.testing.assert_allclose(ours(["head:0.2=mean"]), mlm_loss(), atol=TOL, rtol=0)
    mean = output_means(model, layers[0], ids, pre=False)
    with hooked((layers[0], channel_hook([7], mean[[7]]), False)):
        np.testing.assert_allclose(ours(["channel:0.7=mean"]), mlm_loss(), atol=TOL, rtol=0)


def test_needle_records_its_edits_and_head_edits_reach_the_greedy_continuation():
    """needle's edits are recorded; zeroing every head of every layer equals the reference hooks on the answer's
    log-probability (teacher-forced pass)."""
    from test_needle import HAYSTACK, TASK, planted_llama

    from posprobe.pipelines.needle import NeedleGrid, needle

    model, tokenizer = planted_llama()
    grid = NeedleGrid(lengths=(120,), depths=(0.5,), trials=1, seed=3)
    result = needle(model, tokenizer=tokenizer, haystack=HAYSTACK, grid=grid, task=TASK, edits=["head:*.*"])
    assert result.edits == ["head:*.*"] and result.metadata()["edits"] == ["head:*.*"]
    record = result.records[0]
    ids = torch.tensor([record["prompt_ids"] + record["answer_ids"]]) if "prompt_ids" in record else None
    if ids is None:
        pytest.skip("prompts.jsonl holds no token ids")
    d_h = model.config.hidden_size // model.config.num_attention_heads
    heads = list(range(model.config.num_attention_heads))
    hooks = [(layer.self_attn.o_proj, head_pre_hook(heads, d_h), True) for layer in model.model.layers]
    with hooked(*hooks), torch.no_grad():
        logits = eager(model)(input_ids=ids).logits.double()[0]
    answer = record["answer_ids"]
    start = len(record["prompt_ids"]) - 1
    lp = torch.log_softmax(logits[start : start + len(answer)], -1).gather(-1, torch.tensor(answer)[:, None]).sum()
    assert abs(float(lp) - float(result.log_prob.ravel()[0])) < TOL
    windowed = needle(model, tokenizer=tokenizer, haystack=HAYSTACK, grid=grid, task=TASK, edits=["attend:2,6"])
    mask = additive(attend_allowed(ids.shape[1], 2, 6))
    with torch.no_grad():
        logits = eager(model)(input_ids=ids, attention_mask=mask).logits.double()[0]
    lp = torch.log_softmax(logits[start : start + len(answer)], -1).gather(-1, torch.tensor(answer)[:, None]).sum()
    assert abs(float(lp) - float(windowed.log_prob.ravel()[0])) < TOL
    assert np.abs(windowed.needle_attention).max() < 1e-6  # the last prompt token sees 6 keys, none of the needle


# ---- hostile edits: one line, exit 2, nothing written


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    from tiny_tokenizer import causal_folder

    folder = tmp_path_factory.mktemp("edits-llama")
    causal_folder(folder, tiny_llama())
    rng = np.random.default_rng(1)
    (folder / "docs.txt").write_text("".join(" ".join(f"w{x}" for x in rng.integers(0, 60, size=30)) + "\n"
                                             for _ in range(20)))  # fmt: skip
    return folder


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    import transformers as tf
    from tiny_tokenizer import word_tokenizer

    folder = tmp_path_factory.mktemp("edits-gpt2")
    tokenizer = word_tokenizer(60)
    tokenizer.bos_token, tokenizer.eos_token = "[CLS]", "[SEP]"
    tokenizer.save_pretrained(folder)
    config = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=99, n_positions=40)
    tf.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


HOSTILE = [
    ("bogus:1", "unknown kind"),
    ("head", "unknown kind"),
    ("head:", "needs arguments"),
    ("head:9.1", "layer 9 is out of range"),
    ("head:1.4", "head 4 is out of range"),
    ("head:1.x", "not a whole number"),
    ("head:1.-1", "-1 is below 0"),
    ("head:1.1=half", "neither zero nor mean"),
    ("head:3", "names no layer"),
    ("attend:nan,3", "not a whole number"),
    ("attend:-1,3", "below 0"),
    ("attend:2,0", "below 1"),
    ("attend:4", "attend takes S,W"),
    ("band:0.4", "pair 4 is out of range"),
    ("band:*.3-1", "runs backwards"),
    ("rope-keep:nan", "not a finite number"),
    ("rope-keep:-0.5", "not within 0..1"),
    ("rope-keep:abc", "not a number"),
    ("shift:-3", "below 0"),
    ("shift:1.5", "not a whole number"),
    ("channel:0.32", "channel 32 is out of range"),
    ("channel:2.1", "layer 2 is out of range"),
]
# each case is a fresh `posprobe context` process (1-2 s): the default run keeps one parse refusal and one range
# refusal, the slow tier (CI) runs them all
HOSTILE_QUICK = {"bogus:1", "head:9.1"}


def _cli(folder, *args, out):
    return subprocess.run([sys.executable, "-m", "posprobe", "context", str(folder), "--text",
                           str(folder / "docs.txt"), "--lengths", "16", "--windows", "2", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.parametrize(
    "edit, words", [pytest.param(*case, marks=() if case[0] in HOSTILE_QUICK else pytest.mark.slow) for case in HOSTILE]
)
def test_hostile_edits_are_refused_in_one_line(edit, words, llama_folder, tmp_path):
    out = tmp_path / "out"
    done = _cli(llama_folder, "--edit", edit, out=out)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and words in lines[0] and "--edit" in lines[0], lines
    assert not out.exists()


@pytest.mark.slow  # four fresh processes
def test_edits_on_the_wrong_family_are_refused(gpt2_folder, tmp_path):
    """GPT-2 has a learned table of 40 positions and no rotary embeddings: band, rope-keep and a shift past the
    table's end are refused in one line, before its weights are read; a shift within it runs."""
    (gpt2_folder / "docs.txt").write_text("".join(" ".join(f"w{k % 60}" for k in range(i, i + 30)) + "\n"
                                                  for i in range(20)))  # fmt: skip
    for edit, words in (("band:*.0", "no rotary embeddings"), ("rope-keep:0.5", "no rotary embeddings"),
                        ("shift:30", "past its end")):  # fmt: skip
        out = tmp_path / edit.replace(":", "_").replace("*", "all")
        done = _cli(gpt2_folder, "--edit", edit, out=out)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1 and words in lines[0], done.stderr
        assert not out.exists()
    done = _cli(gpt2_folder, "--edit", "shift:20", "--json", out=tmp_path / "ok")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["edits"] == ["shift:20"]


def test_hybrid_refusal_names_the_other_layers():
    from posprobe.edits import check_edits, edit_model, parse_edits
    from posprobe.errors import ArgumentValueError

    config = {"model_type": "lfm2", "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 99, "norm_eps": 1e-5, "max_position_embeddings": 64,
              "layer_types": ["conv", "full_attention", "conv", "full_attention"]}  # fmt: skip
    model = edit_model(config, "tiny-lfm2")
    assert model.attention_layers == (1, 3)
    with pytest.raises(ArgumentValueError, match=r"layer 0 of 'tiny-lfm2' has no softmax attention: layers 0,2 are"):
        check_edits(parse_edits(["head:0.1"]), model)
    check_edits(parse_edits(["head:*.1", "head:3.0", "channel:0.5"]), model)


@pytest.mark.slow
def test_cli_json_and_npz_record_the_edits(llama_folder, tmp_path):
    from posprobe.formats.writing import load_npz

    out = tmp_path / "out"
    done = _cli(llama_folder, "--edit", "head:1.2=mean", "--edit", "attend:2,4", "--json", out=out)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["edits"] == ["head:1.2=mean", "attend:2,4"]
    metadata, _ = load_npz(record["npz"])
    assert metadata["edits"] == ["head:1.2=mean", "attend:2,4"]


# ---- the unedited run's properties: --device auto (layers offloaded to disk), torchrun, the blockwise route

EDITED = ["--edit", "head:1.2=mean", "--edit", "attend:2,4", "--edit", "channel:0.3", "--edit", "shift:3"]


def _npz_equal(one, two, rtol: float) -> None:
    with np.load(one) as a, np.load(two) as b:
        assert a.files == b.files
        for name in a.files:
            if a[name].dtype.kind == "f":
                np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=1e-7, equal_nan=True, err_msg=name)
            else:
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow  # two processes, every layer read from disk
def test_edited_context_with_device_auto_equals_the_plain_edited_run(llama_folder, tmp_path):
    """`--device auto --max-memory cpu=20KB` (every layer to disk) with edits, =mean's first pass included, writes
    the arrays of the edited run in memory."""
    plain = _cli(llama_folder, *EDITED, out=tmp_path / "plain")
    offloaded = _cli(llama_folder, *EDITED, "--device", "auto", "--max-memory", "cpu=20KB", out=tmp_path / "auto")
    assert plain.returncode == 0 and offloaded.returncode == 0, plain.stderr + offloaded.stderr
    _npz_equal(tmp_path / "plain" / "context.npz", tmp_path / "auto" / "context.npz", rtol=1e-5)


def test_attend_in_blocks_equals_whole_matrices():
    """On the blockwise route (blocks of 3 query rows), attend's query numbering follows each block's first row:
    the recorded attention equals the whole-matrix route's."""
    from test_edits_text import texts, tiny_base

    model, ids = tiny_base(), texts()
    runs = [posprobe.attention_profiles(model, input_ids=ids, max_length=16, batch_size=3, edits=["attend:2,3"],
                                        weights_correlation=False, block_size=size) for size in (0, 3)]  # fmt: skip
    np.testing.assert_allclose(runs[0].profiles.prob_profiles, runs[1].profiles.prob_profiles, atol=1e-6,
                               equal_nan=True)  # fmt: skip
    np.testing.assert_allclose(runs[0].profiles.mean_distance, runs[1].profiles.mean_distance, atol=1e-6)


@pytest.mark.slow
def test_edited_context_on_two_ranks_equals_one_process(llama_folder, tmp_path):
    """torchrun with 2 ranks (gloo): the windows shared out, =mean's sums added over the ranks, the same arrays."""
    from test_distributed import _run

    args = ["context", str(llama_folder), "--text", str(llama_folder / "docs.txt"), "--lengths", "16",
            "--windows", "5", "--batch-size", "2", *EDITED]  # fmt: skip
    one, two = _run([*args, "--out", str(tmp_path / "one")], 1), _run([*args, "--out", str(tmp_path / "two")], 2)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    _npz_equal(tmp_path / "one" / "context.npz", tmp_path / "two" / "context.npz", rtol=1e-9)
