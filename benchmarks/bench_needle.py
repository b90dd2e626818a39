"""Benchmark `posprobe needle`'s per-prompt scoring against transformers' own way on the same prompts.

posprobe: one forward pass over prompt + answer with the retrieval attention read (`score_prompt`: log-probability,
exact match from the teacher-forced argmax, the last prompt token's attention on the needle per layer and head;
generate only for the rest of a greedy continuation that departs from the answer).
reference: transformers' forward over prompt + answer (sdpa, the log-probability) + `generate` of len(answer)
greedy tokens (exact match) — and no retrieval attention at all.
naive-attention: the reference with the forward run as eager attention with `output_attentions=True` (the usual way
to get the retrieval attention: every layer's full matrix is returned).

Each way runs every prompt once per round, the ways alternating, rounds repeated; the median round is reported, in
CPU seconds of this process (one thread: what a loaded machine's wall clock does not show) and in wall seconds.
The results must agree (log-probability to 1e-4, exact match equal) or the script stops.

    python benchmarks/bench_needle.py [--model SmolLM2-135M-Instruct] [--lengths 256,1024] [--rounds 3] [--miss]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch


def reference(model, prompt, eager_attention: bool = False):
    """(log_prob, exact, retrieval attention or None) the plain transformers way."""
    ids = list(prompt.prompt_ids) + list(prompt.answer_ids)
    n, a = len(prompt.prompt_ids), len(prompt.answer_ids)
    previous = model.config._attn_implementation
    if eager_attention:
        model.set_attn_implementation("eager")
    try:
        out = model(input_ids=torch.tensor([ids]), use_cache=False, output_attentions=eager_attention)
    finally:
        model.set_attn_implementation(previous)
    logp = torch.log_softmax(out.logits[0, n - 1 : n - 1 + a].double(), -1)
    log_prob = float(logp.gather(1, torch.tensor(prompt.answer_ids)[:, None]).sum())
    attention = None
    if eager_attention:
        s, e = prompt.needle_span
        attention = torch.stack([x[0, :, n - 1, s:e].sum(-1) for x in out.attentions])
    generated = model.generate(torch.tensor([list(prompt.prompt_ids)]), max_new_tokens=a, do_sample=False,
                               num_beams=1, eos_token_id=None, pad_token_id=0)[0, n:].tolist()  # fmt: skip
    return log_prob, generated == list(prompt.answer_ids), attention


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--lengths", default="256,1024")
    parser.add_argument("--depths", default="0.25,0.75")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--miss", action="store_true", help="also score a wrong key (another trial's): posprobe generates too"
    )
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from posprobe.checkpoint import resolve_model
    from posprobe.checkpoint.loading import build_model, load_tokenizer
    from posprobe.pipelines.needle_prompts import Haystack, NeedleTask, PromptBuilder
    from posprobe.texts.reading import iter_texts

    torch.set_grad_enabled(False)
    source = resolve_model(args.model, with_tokenizer=True)
    tokenizer = load_tokenizer(source.path)
    model = build_model(source, AutoModelForCausalLM).eval()
    encode = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    builder = PromptBuilder(NeedleTask(), Haystack(iter_texts("builtin:kjv"), encode, "builtin:kjv"), tokenizer, 0)
    lengths = [int(x) for x in args.lengths.split(",")]
    depths = [float(x) for x in args.depths.split(",")]
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    print(f"model {args.model}: {layers} layers x {heads} heads; threads {torch.get_num_threads()}")
    for length in lengths:
        for miss in [False, True] if args.miss else [False]:
            prompts = [builder.build(length, depth, 0) for depth in depths]
            if miss:  # the answer scored is another trial's key: the worst case for posprobe (it generates too)
                wrong = builder.build(length, depths[0], 1).answer_ids
                prompts = [dataclasses.replace(p, answer_ids=wrong) for p in prompts]
            run_ways(model, prompts, length, miss, args.rounds, layers, heads)


def run_ways(model, prompts, length: int, miss: bool, rounds: int, layers: int, heads: int) -> None:
    """Time the three ways on `prompts` (CPU seconds of this process and wall seconds), check they agree, print."""
    from posprobe.capture.retrieval import RetrievalRun
    from posprobe.pipelines.needle import score_prompt

    ways = ("posprobe", "reference", "naive-attention")
    cpu: dict[str, list[float]] = {way: [] for way in ways}
    wall: dict[str, list[float]] = {way: [] for way in ways}
    for round_ in range(rounds + 1):  # round 0 warms up
        results = {}
        for way in ways:
            start_cpu, start_wall = time.process_time(), time.perf_counter()
            if way == "posprobe":
                with RetrievalRun(model, layers, heads) as run:
                    results[way] = [score_prompt(run, p, torch.device("cpu")) for p in prompts]
            else:
                results[way] = [reference(model, p, way == "naive-attention") for p in prompts]
            if round_:
                cpu[way].append(time.process_time() - start_cpu)
                wall[way].append(time.perf_counter() - start_wall)
        for ours, ref, naive in zip(results["posprobe"], results["reference"], results["naive-attention"]):
            assert abs(ours.log_prob - ref[0]) < 1e-3 and ours.exact == ref[1], (ours.log_prob, ref)
            assert torch.allclose(torch.as_tensor(ours.needle_attention).float(), naive[2].float(), atol=1e-4)
    c = {way: statistics.median(t) for way, t in cpu.items()}
    w = {way: statistics.median(t) for way, t in wall.items()}
    exact = sum(s.exact for s in results["posprobe"])
    what = "wrong key scored" if miss else "the answer scored"
    print(
        f"length {length}, {what}: {len(prompts)} prompts ({exact} exact), median of {rounds} rounds, CPU s: "
        + ", ".join(f"{way} {t:.2f}" for way, t in c.items())
        + f"; posprobe / reference = {c['posprobe'] / c['reference']:.2f} CPU ({w['posprobe'] / w['reference']:.2f} "
        f"wall), naive-attention / reference = {c['naive-attention'] / c['reference']:.2f} CPU",
        flush=True,
    )


if __name__ == "__main__":
    main()
