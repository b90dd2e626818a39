"""Benchmark (issue 45): `posprobe context` and `posprobe needle` through the library on a mid-size random Llama, for
paired whole-process timings of two source trees (before / after a change to the run loop or the attention kernel).

One process: build the model (seeded, so both trees run the same weights), run the command once, print its
numbers' checksum (the same in both trees when nothing changed). Run each tree's copy alternately under a
whole-process timer, e.g. `/usr/bin/time -v`:

    PYTHONPATH=BEFORE python benchmarks/bench_runtime.py context
    PYTHONPATH=AFTER  python benchmarks/bench_runtime.py context

`python benchmarks/bench_runtime.py context 5` runs it 5 times in the process and prints each run's CPU seconds (a
second line), the figures to pair without the imports and the model's construction.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test helpers: tokenizer, haystack


def model():
    import torch
    import transformers as tf

    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = tf.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
                            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                            bos_token_id=1, eos_token_id=1)  # fmt: skip
    return tf.LlamaForCausalLM(config).eval()


def main(command: str, repeats: int = 1) -> None:
    """Run `command` `repeats` times on one model; print the numbers' checksum, then the CPU seconds of each run
    (the process's own, `time.process_time`: imports and the model's construction left out)."""
    import time

    import numpy as np

    net = model()
    seconds = []
    for _ in range(repeats):
        start = time.process_time()
        if command == "context":
            from posprobe.pipelines.context import context

            rng = np.random.default_rng(0)
            documents = [rng.integers(2, 512, size=300).tolist() for _ in range(40)]
            result = context(net, [256, 512], documents=documents, windows=6, rope_scaling="none,linear:2",
                             batch_size=2)  # fmt: skip
            numbers = float(result.position_loss.sum()), float(result.perplexity.sum())
        else:
            from test_needle import HAYSTACK, TASK, char_tokenizer

            from posprobe.pipelines.needle import NeedleGrid, needle

            grid = NeedleGrid(lengths=(150, 300), depths=(0.0, 0.5, 1.0), trials=2, seed=0)
            result = needle(net, tokenizer=char_tokenizer(), haystack=HAYSTACK, grid=grid, task=TASK)
            numbers = float(result.log_prob.sum()), float(result.needle_attention.sum())
        seconds.append(time.process_time() - start)
    print(*numbers)
    print("cpu", *(f"{s:.3f}" for s in seconds))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
