"""Benchmark: `posprobe attention` on the eager route (families outside AttentionInterface) vs a plain eager forward
pass with `output_attentions` over the same batches.

Models: random weights at real sizes, built from their config classes (timings do not depend on the weights):
T5-small's encoder (6 layers, d 512, 8 heads, relative bucket bias), an MPNet-base (12 layers, d 768, 12 heads),
a DeBERTa-v3-small (6 layers, d 768, 12 heads, disentangled), a BLOOM with 12 layers, d 768, 12 heads (ALiBi).
Texts: random token ids, lengths uniform in 8..max_length, the same batches for every side, under
`torch.inference_mode`.
- baseline: `model(input_ids, attention_mask, output_attentions=True)` per batch (T5: its encoder), eager;
- observed: the same forward inside the capture's `softmax_inputs` TorchFunctionMode (the cost of observing every
  torch call of the forward);
- posprobe: `attention_profiles(model, input_ids=...)` (capture on the eager route with its first-batch checks,
  both reducers, the final statistics; no weights correlation).
Sides alternate, repeated (the machine is shared): medians and paired medians of the CPU-time ratios.

    python benchmarks/bench_capture_eager.py [--texts 256] [--max-length 128] [--batch-size 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def models() -> dict:
    import transformers as tf

    return {
        "t5-small encoder": lambda: tf.T5Model(tf.T5Config(d_model=512, d_kv=64, num_heads=8, d_ff=2048,
                                                            num_layers=6, vocab_size=32128)),
        "mpnet-base": lambda: tf.MPNetModel(tf.MPNetConfig()),
        "deberta-v3-small": lambda: tf.DebertaV2Model(tf.DebertaV2Config(
            hidden_size=768, num_hidden_layers=6, num_attention_heads=12, intermediate_size=3072,
            relative_attention=True, pos_att_type="p2c|c2p", position_buckets=256, max_relative_positions=-1,
            norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False, vocab_size=128100)),
        "bloom (12 x 768)": lambda: tf.BloomModel(tf.BloomConfig(hidden_size=768, n_layer=12, n_head=12)),
    }  # fmt: skip


def batches(ids, batch_size):
    from posprobe.capture import id_tokenizer, token_batches

    return list(token_batches(ids, id_tokenizer((), 10**9), batch_size=batch_size, pad_id=0))


def baseline(net, token_batches_, observe: bool) -> tuple[float, float]:
    import torch

    from posprobe.capture.eager import softmax_inputs

    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for batch in token_batches_:
            b, m = batch.input_ids.shape
            if observe:
                with softmax_inputs(b, net.config.num_attention_heads, m):
                    net(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)
            else:
                net(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)
    return time.perf_counter() - start, time.process_time() - cpu


def ours(model, ids, max_length: int, batch_size: int) -> tuple[float, float]:
    from posprobe.pipelines.attention import attention_profiles

    start, cpu = time.perf_counter(), time.process_time()
    attention_profiles(model, input_ids=ids, max_length=max_length, batch_size=batch_size, weights_correlation=False)
    return time.perf_counter() - start, time.process_time() - cpu


def _ratios(base: list, other: list) -> dict:
    import numpy as np

    b, o = np.array([t[1] for t in base]), np.array([t[1] for t in other])
    return {"of_medians": round(float(np.median(o) / np.median(b)), 3), "paired": round(float(np.median(o / b)), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    args = parser.parse_args()
    import numpy as np
    import torch

    from posprobe.capture import stack_to_run

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    ids = [rng.integers(5, 30000, size=int(rng.integers(8, args.max_length + 1))).tolist() for _ in range(args.texts)]
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
        "texts": args.texts,
        "tokens": sum(map(len, ids)),
        "max_length": args.max_length,
        "batch_size": args.batch_size,
        "models": {},
    }
    for name, make in models().items():
        torch.manual_seed(0)
        model = make().eval()
        net = stack_to_run(model)
        net.set_attn_implementation("eager")
        padded = batches(ids, args.batch_size)
        baseline(net, padded[:1], False)  # warm-up
        base_t, observed_t, ours_t = [], [], []
        for _ in range(args.repeats):
            base_t.append(baseline(net, padded, False))
            observed_t.append(baseline(net, padded, True))
            ours_t.append(ours(model, ids, args.max_length, args.batch_size))
        report["models"][name] = {
            "cpu_baseline_s": [round(t[1], 2) for t in base_t],
            "cpu_observed_s": [round(t[1], 2) for t in observed_t],
            "cpu_posprobe_s": [round(t[1], 2) for t in ours_t],
            "cpu_ratio_observed": _ratios(base_t, observed_t),
            "cpu_ratio_posprobe": _ratios(base_t, ours_t),
            "wall_ratio_posprobe": round(float(np.median([o[0] / b[0] for b, o in zip(base_t, ours_t)])), 3),
        }
        print(name, json.dumps(report["models"][name]), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
