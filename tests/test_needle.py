"""`posprobe needle` (SPEC §18) on tiny in-code causal LMs with a character tokenizer (every character one token,
digits included, so a pass key is a few tokens and nothing else in the haystack is a digit).

- retrieval attention equals the row of the model's own eager attention, for a rotary GQA Llama, a sliding-window
  Mistral (the window shorter than the prompt) and an eager-route family (BLOOM, ALiBi), and the model's logits are
  unchanged by the reading;
- a Llama whose heads are planted to attend to digit tokens: those heads come out on top, with the attention
  planted;
- log-probability and exact match equal a naive computation (one forward per answer token; transformers'
  generate);
- recorded spans decode to the needle, lengths are exact, depths are measured;
- hostile input: one line, exit 2, no output folder.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_hostile import assert_one_line_error, run_cli

from posprobe.analysis.needle import answer_scores, position_gaps, ranked_heads
from posprobe.pipelines.needle import NeedleGrid, needle
from posprobe.pipelines.needle_prompts import NeedleTask

HAYSTACK = [
    "The river ran past the old mill. Birds sang in the tall trees! Who built the mill? Nobody remembers now. "
    "Wheat grew on the hills around it, and the farmers brought their grain each autumn. " * 12
]
TASK = NeedleTask(intro="Find the key.\n", needle=" The key is {answer}.", question="\nThe key is")
PLANTED = [(0, 2), (1, 1)]  # (layer, head) whose last-token attention is planted on digit tokens


def char_tokenizer():
    """A character-level fast tokenizer: <unk> 0, <eos> 1, then printable ASCII and newline."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {"<unk>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>")


def tiny_causal_lm(kind: str = "llama", **overrides):
    import transformers as tf

    torch.manual_seed(0)
    size = dict(vocab_size=98, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    if kind == "bloom":
        config = tf.BloomConfig(vocab_size=98, hidden_size=32, n_layer=2, n_head=4, eos_token_id=1, bos_token_id=1)
        return tf.BloomForCausalLM(config).eval()
    if kind == "falcon":  # built eager (before transformers 5.25 Falcon could not switch to it after loading)
        config = tf.FalconConfig(**size, max_position_embeddings=512, eos_token_id=1, bos_token_id=1)
        return tf.FalconForCausalLM._from_config(config, attn_implementation="eager").eval()
    cls_config, cls_model = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
                             "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
                             "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM),
                             "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM)}[kind]  # fmt: skip
    config = cls_config(**size, intermediate_size=48, num_key_value_heads=2, max_position_embeddings=512,
                        eos_token_id=1, bos_token_id=1, **overrides)  # fmt: skip
    return cls_model(config).eval()


def planted_llama():
    """A tiny Llama where heads `PLANTED` attend from every query to digit tokens: channel 0 of every embedding is
    1 and channel 1 is 1 on digits only; the head's query reads channel 0 and its key channel 1, in the rotary
    pair with the lowest frequency (rope_theta 1e12: it turns by < 1e-6 rad over the prompt)."""
    tokenizer = char_tokenizer()
    model = tiny_causal_lm(rope_theta=1e12)
    digits = tokenizer.convert_tokens_to_ids(list("0123456789"))
    head_dim = 8
    slot = head_dim // 2 - 1  # rotate_half pairs (f, f + d/2): f = d/2 - 1 has the lowest frequency
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        embed[:, :2] = 0.0
        embed[:, 0] = 1.0
        embed[digits, 1] = 1.0
        for layer, head in PLANTED:
            attn = model.model.layers[layer].self_attn
            model.model.layers[layer].input_layernorm.weight.fill_(1.0)
            kv_head = head // 2
            attn.q_proj.weight[head * head_dim : (head + 1) * head_dim] = 0.0
            attn.k_proj.weight[kv_head * head_dim : (kv_head + 1) * head_dim] = 0.0
            attn.q_proj.weight[head * head_dim + slot, 0] = 400.0
            attn.k_proj.weight[kv_head * head_dim + slot, 1] = 10.0
    return model, tokenizer


def eager_rows(model, ids: torch.Tensor, row: int, span: tuple[int, int]) -> torch.Tensor:
    """(L, H) the brute-force reference: the model's own eager attention matrices, row `row` summed over `span`."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(input_ids=ids, output_attentions=True)
    finally:
        model.set_attn_implementation(previous)
    return torch.stack([a[0, :, row, span[0] : span[1]].double().sum(-1) for a in out.attentions]), out.logits


@pytest.mark.parametrize(
    "kind, overrides",
    [
        ("llama", {}),
        ("mistral", {"sliding_window": 40}),
        ("gemma2", {"attn_logit_softcapping": 5.0, "sliding_window": 40, "head_dim": 8}),
        ("gemma3", {"sliding_window": 40, "head_dim": 8, "sliding_window_pattern": 2}),
        ("bloom", {}),
        ("falcon", {}),
    ],
    ids=["llama-gqa", "mistral-window", "gemma2-softcap", "gemma3-local-global", "bloom-eager-route", "falcon-eager"],
)
def test_retrieval_attention_equals_the_eager_row(kind, overrides):
    from posprobe.capture.retrieval import RetrievalRun

    model = tiny_causal_lm(kind, **overrides)
    torch.manual_seed(1)
    ids = torch.randint(2, 98, (1, 90))
    row, span = 70, (20, 35)
    expected, logits = eager_rows(model, ids, row, span)
    with RetrievalRun(model, 2, 4) as run, torch.no_grad():
        output, attention = run.forward(ids, row, [span])
    assert attention.shape == (1, 2, 4)
    torch.testing.assert_close(attention[0], expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(output.logits, logits, atol=1e-4, rtol=1e-4)
    if kind == "mistral":  # the window hides keys 0..30 from query 70: a span there gets nothing
        with RetrievalRun(model, 2, 4) as run, torch.no_grad():
            _, hidden = run.forward(ids, row, [(0, 30)])
        assert float(hidden.abs().max()) == 0.0


@pytest.fixture(scope="module")
def planted_result():
    model, tokenizer = planted_llama()
    grid = NeedleGrid(lengths=(150, 220), depths=(0.0, 0.5, 1.0), trials=2, seed=3)
    return needle(model, tokenizer=tokenizer, haystack=HAYSTACK, grid=grid, task=TASK), model, tokenizer


def test_planted_heads_are_the_top_retrieval_heads(planted_result):
    result, _, _ = planted_result
    assert result.needle_attention.shape == (2, 3, 2, 2, 4)
    top = {(h["layer"], h["head"]) for h in result.top_heads(2)}
    assert top == set(PLANTED)
    for layer, head in PLANTED:  # planted: nearly all of the row on the needle's digits, at every length and depth
        assert result.needle_attention[..., layer, head].min() > 0.95
    others = [(layer, head) for layer in range(2) for head in range(4) if (layer, head) not in PLANTED]
    assert max(result.needle_attention[..., layer, head].max() for layer, head in others) < 0.6
    assert [row[:2] for row in ranked_heads(result.head_attention, 2)] == sorted(
        PLANTED, key=lambda p: -result.head_attention[p]
    )


def test_scores_equal_a_naive_computation(planted_result):
    result, model, tokenizer = planted_result
    for record in result.records[::3]:
        prompt, answer = record["prompt_ids"], record["answer_ids"]
        log_prob = 0.0
        with torch.no_grad():
            for i, token in enumerate(answer):  # one forward per answer token, no cache
                logits = model(input_ids=torch.tensor([prompt + answer[:i]])).logits[0, -1].double()
                log_prob += float(torch.log_softmax(logits, -1)[token])
            generated = model.generate(
                torch.tensor([prompt]), max_new_tokens=len(answer), do_sample=False, num_beams=1, eos_token_id=None,
                pad_token_id=1,
            )[0, len(prompt):].tolist()  # fmt: skip
        assert record["log_prob"] == pytest.approx(log_prob, abs=1e-6)
        assert sum(record["answer_token_log_probs"]) == pytest.approx(log_prob, abs=1e-6)
        assert record["greedy_ids"] == generated
        assert record["exact"] == (generated == answer)
        i, j, t = result.lengths.index(record["length"]), result.depths.index(record["depth"]), record["trial"]
        assert result.log_prob[i, j, t] == record["log_prob"] and result.exact[i, j, t] == record["exact"]


def test_spans_decode_to_the_needle_and_lengths_are_exact(planted_result):
    result, _, tokenizer = planted_result
    for record in result.records:
        ids = record["prompt_ids"]
        start, end = record["needle_span"]
        assert tokenizer.decode(ids[start:end]) == f" The key is {record['answer']}."
        assert tokenizer.decode(record["answer_ids"]) == " " + record["answer"]
        assert len(ids) == record["length"] == record["achieved_length"]
        h0, h1 = record["haystack_span"]
        assert h0 <= start < end <= h1 and tokenizer.decode(ids[:h0]) == "Find the key.\n"
        assert tokenizer.decode(ids[h1:]) == "\nThe key is"
        hay = (h1 - h0) - (end - start)
        assert record["achieved_depth"] == (start - h0) / hay
        if start > h0:  # the needle follows a whole sentence (only the haystack's first fragment is cut)
            assert tokenizer.decode(ids[start - 1]) in ".!?"
        assert abs(record["achieved_depth"] - record["depth"]) < 60 / hay  # the nearest sentence boundary
        if record["depth"] in (0.0, 1.0):
            assert record["achieved_depth"] == record["depth"]
        assert record["text"] == tokenizer.decode(ids)
    keys = {r["trial"]: r["answer"] for r in result.records}
    assert all(r["answer"] == keys[r["trial"]] for r in result.records) and len(set(keys.values())) == 2


def test_answer_scores_known_answers():
    logits = torch.full((3, 5), -10.0)
    logits[0, 2] = logits[1, 4] = logits[2, 1] = 10.0
    token_log_probs, exact, greedy = answer_scores(logits, [2, 4, 1])
    assert exact and greedy == [2, 4, 1]
    assert token_log_probs == pytest.approx([float(torch.log_softmax(logits[0].double(), -1)[2])] * 3)
    _, exact, greedy = answer_scores(logits, [2, 3, 1])
    assert not exact and greedy == [2, 4]  # the greedy prefix stops at its first departure


def test_position_gaps_of_a_u_curve():
    first, last = position_gaps(np.array([[1.0, 0.5, 0.25, 0.75, 0.9], [1.0, 1.0, 1.0, 1.0, 1.0]]))
    assert first.tolist() == pytest.approx([0.5, 0.0]) and last.tolist() == pytest.approx([0.4, 0.0])
    assert np.isnan(position_gaps(np.ones((1, 2)))[0]).all()


@pytest.fixture(scope="module")
def planted_folder(tmp_path_factory):
    model, tokenizer = planted_llama()
    folder = tmp_path_factory.mktemp("planted-llama")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    haystack = folder / "haystack.txt"
    haystack.write_text(HAYSTACK[0] + "\n", encoding="utf-8")
    return folder


# \\n as typed on a command line (the CLI makes it a new line)
TASK_FLAGS = ["--intro", "Find the key.\\n", "--needle", " The key is {answer}.", "--question", "\\nThe key is"]


def test_cli_writes_the_grid(planted_folder, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["needle", planted_folder, "--haystack", planted_folder / "haystack.txt", "--lengths", "150",
            "--depths", "0,0.5,1", "--trials", "2", *TASK_FLAGS, "--out", out, "--json"]  # fmt: skip
    code, stdout, err = run_cli(args, capsys)
    assert code == 0, err
    record = json.loads(stdout)
    assert (record["needle_attending_heads"][0]["layer"], record["needle_attending_heads"][0]["head"]) in PLANTED
    from posprobe.formats.writing import load_npz

    metadata, arrays = load_npz(out / "needle.npz")
    assert arrays["needle_attention"].shape == (1, 3, 2, 2, 4) and arrays["log_prob"].shape == (1, 3, 2)
    assert arrays["lengths"].tolist() == [150] and arrays["depths"].tolist() == [0.0, 0.5, 1.0]
    lines = (out / "prompts.jsonl").read_text().splitlines()
    assert len(lines) == 6 and json.loads(lines[0])["needle_span"][0] == 14
    assert {p.name for p in out.iterdir()} >= {"needle_grid.png", "needle_depth.png", "needle_heads.png"}
    from posprobe.pipelines.needle_result import NeedleResult

    loaded = NeedleResult.load(out)  # what was written reads back to the same result
    assert loaded.to_dict() == {k: v for k, v in record.items() if k != "files"}
    assert loaded.table() + "\n" == (out / "needle.txt").read_text()


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--lengths", "5000", "--beyond-window"], ["haystack", "fewer than"]),
        (["--needle", " The key is here."], ["{answer}"]),
        (["--depths", "0,1.5"], ["--depths", "outside 0..1"]),
        (["--lengths", "600"], ["--lengths", "window of 512", "--beyond-window"]),
        (["--lengths", "20"], ["leaves no room"]),
        (["--question", " It is {answer}"], ["--question", "give the answer away"]),
        (["--lengths", "1e3"], ["--lengths", "whole numbers"]),
        (["--haystack", "/no/such/haystack.txt"], ["haystack.txt"]),
        (["--haystack", "builtin:nothing"], ["builtin:nothing", "builtin:kjv"]),
        (["--trials", "0"], ["--trials"]),
    ],
    ids=[
        "short-haystack",
        "needle-without-answer",
        "depth-outside",
        "past-window",
        "too-short",
        "question-answer",
        "bad-length",
        "missing-haystack",
        "unknown-builtin",
        "no-trials",
    ],  # fmt: skip
)
def test_hostile_input_is_one_line(planted_folder, tmp_path, capsys, extra, words):
    out = tmp_path / "out"
    flags = {
        "--haystack": planted_folder / "haystack.txt",
        "--lengths": "150",
        **dict(zip(TASK_FLAGS[::2], TASK_FLAGS[1::2])),
    }
    for flag in extra[::2]:
        flags.pop(flag, None)
    args = ["needle", planted_folder, "--out", out, *[x for pair in flags.items() for x in pair], *extra]
    code, stdout, err = run_cli(args, capsys)
    assert_one_line_error(code, stdout, err, *words)
    assert not out.exists()


def test_encoder_is_refused(capsys, tmp_path):
    out = tmp_path / "o"
    code, stdout, err = run_cli(["needle", "all-MiniLM-L6-v2", "--out", out], capsys)
    assert_one_line_error(code, stdout, err, "not a causal language model")
    assert not out.exists()


def fixed_attention(model_class):
    """A subclass of `model_class` that transformers says cannot switch its attention after loading, as it says of a
    class whose attention does not go through AttentionInterface (Falcon before transformers 5.25): its cached answer
    to `_can_set_attn_implementation`. Whether a real family can switch is decided by asking transformers."""
    return type(f"Fixed{model_class.__name__}", (model_class,), {"_can_set_attn_implementation_cached_value": False})


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("llama", "cannot switch to posprobe's row-reading attention.*a transformers version"),
        ("falcon", "cannot switch to its eager attention.*attn_implementation='eager'"),  # an eager-route family
    ],
)
def test_a_model_that_cannot_switch_its_attention_is_refused(kind, message):
    import transformers as tf

    from posprobe.errors import PosprobeError

    config_class, model_class = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
                                 "falcon": (tf.FalconConfig, tf.FalconForCausalLM)}[kind]  # fmt: skip
    config = config_class(vocab_size=98, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    model = fixed_attention(model_class)._from_config(config, attn_implementation="sdpa").eval()
    assert not model._can_set_attn_implementation()
    grid = NeedleGrid(lengths=(150,), depths=(0.5,), trials=1)
    with pytest.raises(PosprobeError, match=message) as err:
        needle(model, tokenizer=char_tokenizer(), haystack=HAYSTACK, grid=grid, task=TASK)
    assert "\n" not in str(err.value)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "gpt_neox", "qwen3", "phi", "opt", "gpt_neo", "mpt"])
def test_retrieval_rows_across_causal_families(kind):
    """More families (learned tables, partial rotary, q/k norms, GPT-Neo's local layers, MPT's ALiBi on the eager
    route): the rows equal eager attention's and the logits are unchanged."""
    import transformers as tf

    from posprobe.capture.retrieval import RetrievalRun

    torch.manual_seed(0)
    small = dict(vocab_size=98, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    small["max_position_embeddings"] = 128
    neo = dict(attention_types=[[["global", "local"], 1]], window_size=16, max_position_embeddings=128)
    build = {
        "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=98, n_positions=128, n_embd=32, n_layer=2, n_head=4)),
        "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(**small, intermediate_size=48)),
        "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(**small, num_key_value_heads=2, head_dim=8)),
        "phi": ("PhiForCausalLM", "PhiConfig", dict(**small, intermediate_size=48)),
        "opt": ("OPTForCausalLM", "OPTConfig", dict(**small, ffn_dim=48, word_embed_proj_dim=32)),
        "gpt_neo": ("GPTNeoForCausalLM", "GPTNeoConfig", dict(vocab_size=98, hidden_size=32, num_layers=2,
                                                              num_heads=4, **neo)),
        "mpt": ("MptForCausalLM", "MptConfig", dict(vocab_size=98, d_model=32, n_layers=2, n_heads=4, max_seq_len=128)),
    }  # fmt: skip
    model_class, config_class, config = build[kind]
    model = getattr(tf, model_class)(getattr(tf, config_class)(**config)).eval()
    ids = torch.randint(2, 98, (1, 90))
    expected, logits = eager_rows(model, ids, 70, (20, 35))
    with RetrievalRun(model, 2, 4) as run, torch.no_grad():
        output, attention = run.forward(ids, 70, [(20, 35)], use_cache=False)
    torch.testing.assert_close(attention[0], expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(output.logits, logits, atol=1e-4, rtol=1e-4)


def test_task_answers_are_fixed_or_drawn_from_seed_and_trial():
    fixed = NeedleTask(
        intro="Find the city.\n", needle=" The city is {answer}.", question=" The city is", answer=" Paris "
    )
    assert fixed.answer_for(0, 0) == fixed.answer_for(5, 9) == "Paris"
    keys = [NeedleTask(digits=4).answer_for(7, t) for t in range(50)]
    assert keys == [NeedleTask(digits=4).answer_for(7, t) for t in range(50)]  # the same on any rank, any run
    assert all(len(k) == 4 and k.isdigit() and k[0] != "0" for k in keys) and len(set(keys)) > 40
    tokenizer = char_tokenizer()
    model = tiny_causal_lm()
    grid = NeedleGrid(lengths=(120,), depths=(0.5,), trials=2)
    result = needle(model, tokenizer=tokenizer, haystack=HAYSTACK, grid=grid, task=fixed)
    for record in result.records:
        start, end = record["needle_span"]
        assert tokenizer.decode(record["prompt_ids"][start:end]) == " The city is Paris."
        assert tokenizer.decode(record["answer_ids"]) == " Paris"


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_folder(planted_folder, tmp_path_factory):
    """The planted Llama with a ChatML chat template on its (character) tokenizer."""
    import shutil

    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("chat-llama")
    shutil.copytree(planted_folder, folder, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_chat_prompts_are_the_tokenizers_own_template(chat_folder, tmp_path, capsys):
    """`needle --chat` (issue 49): every prompt is the tokenizer's chat template applied to its recorded user
    message, the generation prompt opened and the question's last words starting the reply
    (`tokenizer.apply_chat_template`, here), token for token; the default for a tokenizer with a template;
    --no-chat gives the plain prompts; --chat on a tokenizer without one is refused in one line."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_folder)
    base = ["needle", chat_folder, "--haystack", chat_folder / "haystack.txt", "--lengths", "400", "--depths", "0,1",
            "--trials", "1"]  # fmt: skip
    records = {}
    for flag in ("--chat", None, "--no-chat"):
        out = tmp_path / str(flag)
        code, stdout, err = run_cli([*base, *([flag] if flag else []), "--out", out, "--json"], capsys)
        assert code == 0, err
        record = json.loads(stdout)
        assert record["task"]["chat"] is (flag != "--no-chat")
        assert record["prompt_format"].startswith("the tokenizer's chat template" if flag != "--no-chat" else "plain")
        records[flag] = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert records["--chat"] == records[None]
    for record in records["--chat"]:
        assert record["format"] == "chat" and record["assistant_prefix"] == "The pass key is"
        (message,) = record["messages"]
        assert message["role"] == "user" and message["content"].endswith("\nWhat is the pass key?")
        assert message["content"].startswith("A pass key is hidden somewhere in the long text below.")
        expected = tokenizer.apply_chat_template(record["messages"], tokenize=False, add_generation_prompt=True)
        assert expected.startswith("<|im_start|>user\n") and expected.endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert record["text"] == expected + "The pass key is"
        assert record["prompt_ids"] == tokenizer(expected + "The pass key is", add_special_tokens=False)["input_ids"]
        assert record["achieved_length"] == 400
    for record in records["--no-chat"]:
        assert record["format"] == "plain" and "messages" not in record and "<|im_start|>" not in record["text"]
        assert record["text"].endswith("\nWhat is the pass key? The pass key is")
    out = tmp_path / "refused"
    code, stdout, err = run_cli(["needle", planted_folder_of(chat_folder), "--haystack", chat_folder / "haystack.txt",
                                 "--lengths", "400", "--chat", "--out", out], capsys)  # fmt: skip
    assert_one_line_error(code, stdout, err, "--chat", "no chat template")


def planted_folder_of(chat_folder):
    """A copy of the chat folder without its chat template."""
    import shutil

    from transformers import AutoTokenizer

    plain = chat_folder.parent / (chat_folder.name + "-plain")
    if not plain.exists():
        shutil.copytree(chat_folder, plain)
        tokenizer = AutoTokenizer.from_pretrained(plain)
        tokenizer.chat_template = None
        for name in ("chat_template.jinja", "chat_template.json"):
            (plain / name).unlink(missing_ok=True)
        tokenizer.save_pretrained(plain)
    return plain


@pytest.mark.parametrize("k, n", [(0, 3), (1, 3), (3, 3), (7, 20), (0, 1)])
def test_wilson_interval_equals_scipys(k, n):
    from scipy.stats import binomtest

    from posprobe.analysis.needle import wilson_interval

    expected = binomtest(k, n).proportion_ci(0.95, method="wilson")
    low, high = wilson_interval(np.array([k]), np.array([n]))
    assert low[0] == pytest.approx(expected.low, abs=1e-12) and high[0] == pytest.approx(expected.high, abs=1e-12)


def _contrast(a, b) -> float:
    """WCAG contrast ratio of two sRGB colours."""

    def lum(rgb):
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb[:3]]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted([lum(a), lum(b)], reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_grid_cells_say_their_n_and_interval_and_read_on_their_colour(planted_result):
    """Each accuracy cell of the grid: its value, its Wilson 95 % interval (scipy's, here) and its n (issue 49);
    every cell's text contrasts with its colour by at least WCAG's 4.5 (black on dark green did not)."""
    from matplotlib.colors import to_rgba
    from scipy.stats import binomtest

    from posprobe.plotting.needle import grid_figure

    result = planted_result[0]
    fig = grid_figure(result)
    left, right = [ax for ax in fig.axes if ax.images]  # the colour bars hold no image
    for ax in (left, right):
        image = ax.images[0]
        for text in ax.texts:
            j, i = (round(v) for v in text.get_position())
            cell = image.cmap(image.norm(image.get_array()[i, j]))
            assert _contrast(to_rgba(text.get_color()), cell) >= 4.5, (text.get_text(), cell)
    exact = result.exact.astype(int)
    for text in left.texts:
        j, i = (round(v) for v in text.get_position())
        k, n = int(exact[i, j].sum()), exact.shape[2]
        ci = binomtest(k, n).proportion_ci(0.95, method="wilson")
        assert text.get_text() == f"{k / n:.0%}\n[{100 * ci.low:.0f}–{100 * ci.high:.0f}%]\nn={n}"
    assert all(f"n={result.trials}" in text.get_text() for text in right.texts)
