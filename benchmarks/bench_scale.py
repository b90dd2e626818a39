"""Scale-out measurements (SPEC §19, issue 37).

memory:  peak resident memory of `posprobe.attention_profiles` on one text of N tokens of a tiny rotary Llama
         (2 layers x 2 heads, hidden 32), one fresh process per length, against the process that only loads the
         model and builds the same input (the baseline); shows how the peak grows with N.
ranks:   `posprobe attention` on the same texts in one process with 2 threads vs `torchrun --nproc-per-node 2`
         with 1 thread per rank (the same total threads), wall seconds, medians of `--repeats`.
windows: the same for `posprobe context` (batches of windows shared out) and `posprobe needle` (prompts shared out)
         on a small causal Llama (4 layers x 4 heads, hidden 128), with torchrun's own cost beside them
         (`torchrun --nproc-per-node 1`, no process group, against the plain command, 1 thread each).

    python benchmarks/bench_scale.py memory --lengths 512 1024 2048 4096
    python benchmarks/bench_scale.py ranks --texts 400 --repeats 3
    python benchmarks/bench_scale.py windows --repeats 3 [--commands context needle]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PEAK = """
import json, resource, sys, torch
import posprobe
n, folder, measure = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
ids = [[5 + (7 * i) % 60 for i in range(n)]]
if measure:
    posprobe.attention_profiles(folder, input_ids=ids, max_length=n, weights_correlation=False)
else:
    from transformers import AutoModel
    AutoModel.from_pretrained(folder)
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
"""


def tiny_llama(folder: Path, positions: int) -> None:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(
        vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=positions,
    )  # fmt: skip
    tf.LlamaModel(config).eval().save_pretrained(folder)


def _env(threads: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def memory(lengths: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "llama"
        tiny_llama(folder, max(lengths))
        print("| tokens | peak RSS (GiB) | baseline (GiB) | attention (GiB) | seconds |")
        print("|---:|---:|---:|---:|---:|")
        for n in lengths:
            peaks, seconds = [], 0.0
            for measure in ("0", "1"):
                started = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, "-c", _PEAK, str(n), str(folder), measure],
                    env=_env(1), capture_output=True, text=True,
                )  # fmt: skip
                seconds = time.perf_counter() - started
                if proc.returncode != 0:
                    peaks.append(float("nan"))
                    print(f"<!-- {n}: rc {proc.returncode}: {proc.stderr.strip()[-300:]} -->")
                    continue
                peaks.append(json.loads(proc.stdout.strip().splitlines()[-1]) / 2**30)
            print(f"| {n} | {peaks[1]:.2f} | {peaks[0]:.2f} | {peaks[1] - peaks[0]:.2f} | {seconds:.1f} |", flush=True)


def ranks(n_texts: int, repeats: int) -> None:
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_tokenizer import word_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "llama"
        tiny_llama(folder, 128)
        word_tokenizer(60).save_pretrained(folder)
        rng = np.random.default_rng(0)
        texts = Path(tmp) / "texts.txt"
        rows = [" ".join(f"w{x}" for x in rng.integers(0, 60, size=rng.integers(20, 120))) for _ in range(n_texts)]
        texts.write_text("\n".join(rows) + "\n")
        args = ["-m", "posprobe", "attention", str(folder), "--text", str(texts), "--max-length", "128", "--json"]
        runs = {
            "1 process, 2 threads": ([sys.executable, *args], 2),
            "torchrun 2 ranks x 1 thread": (
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *args],
                1,
            ),
            "1 process, 1 thread": ([sys.executable, *args], 1),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for repeat in range(repeats):
            for name, (cmd, threads) in runs.items():
                out = Path(tmp) / f"out-{repeat}-{threads}-{len(cmd)}"
                started = time.perf_counter()
                proc = subprocess.run([*cmd, "--out", str(out)], env=_env(threads), capture_output=True, text=True)
                times[name].append(time.perf_counter() - started)
                if proc.returncode != 0:
                    raise SystemExit(proc.stderr[-2000:])
        base = statistics.median(times["1 process, 2 threads"])
        print(f"{n_texts} texts of 20-120 tokens, medians of {repeats}")
        print("| run | wall s | / 1 process, 2 threads |")
        print("|---|---:|---:|")
        for name, values in times.items():
            print(f"| {name} | {statistics.median(values):.2f} | {statistics.median(values) / base:.2f}× |")


_RUNS = {  # name: (torchrun ranks, 0 for the plain command; threads per process)
    "1 process, 2 threads": (0, 2),
    "torchrun 2 ranks x 1 thread": (2, 1),
    "1 process, 1 thread": (0, 1),
    "torchrun 1 rank x 1 thread": (1, 1),
}


def windows(repeats: int, which: list[str]) -> None:
    """context and needle: every configuration of `_RUNS` a fresh command, interleaved, wall seconds."""
    import numpy as np
    import torch
    import transformers as tf

    sys.path.insert(0, str(ROOT / "tests"))
    from test_needle import char_tokenizer
    from tiny_tokenizer import word_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        config = tf.LlamaConfig(vocab_size=99, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
                                bos_token_id=2, eos_token_id=3)  # fmt: skip
        context_folder, needle_folder = Path(tmp) / "context", Path(tmp) / "needle"
        tf.LlamaForCausalLM(config).eval().save_pretrained(context_folder)
        tokenizer = word_tokenizer(60)
        tokenizer.bos_token, tokenizer.eos_token = "[CLS]", "[SEP]"
        tokenizer.save_pretrained(context_folder)
        rng = np.random.default_rng(0)
        texts = Path(tmp) / "docs.txt"
        texts.write_text("".join(" ".join(f"w{x}" for x in rng.integers(0, 60, size=rng.integers(50, 400))) + "\n"
                                 for _ in range(40)))  # fmt: skip
        config.bos_token_id = config.eos_token_id = 1
        tf.LlamaForCausalLM(config).eval().save_pretrained(needle_folder)
        char_tokenizer().save_pretrained(needle_folder)
        haystack = Path(tmp) / "haystack.txt"
        haystack.write_text("The farmers brought their grain to the mill by the river each autumn. " * 60 + "\n")
        commands = {
            "context": ["context", str(context_folder), "--text", str(texts), "--lengths", "128,256,512",
                        "--windows", "8", "--rope-scaling", "none,yarn:2", "--json"],
            "needle": ["needle", str(needle_folder), "--haystack", str(haystack), "--lengths", "128,256,512",
                       "--depths", "0,0.5,1", "--trials", "4", "--intro", "Find the key.\\n", "--needle",
                       " The key is {answer}.", "--question", "\\nThe key is", "--json"],
        }  # fmt: skip
        for command in which:
            args = commands[command]
            times: dict[str, list[float]] = {name: [] for name in _RUNS}
            for repeat in range(repeats):
                for name, (ranks_, threads) in _RUNS.items():
                    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks_}"]
                    cmd = [sys.executable, *(launcher if ranks_ else []), "-m", "posprobe", *args]
                    out = Path(tmp) / f"out-{command}-{repeat}-{ranks_}-{threads}"
                    started = time.perf_counter()
                    proc = subprocess.run([*cmd, "--out", str(out)], env=_env(threads), capture_output=True, text=True)
                    times[name].append(time.perf_counter() - started)
                    if proc.returncode != 0:
                        raise SystemExit(proc.stderr[-2000:])
            base = statistics.median(times["1 process, 2 threads"])
            print(f"{command}: {' '.join(args[2:-1])}, medians of {repeats}")
            print("| run | wall s (each) | median | / 1 process, 2 threads |")
            print("|---|---|---:|---:|")
            for name, values in times.items():
                each, median = ", ".join(f"{v:.1f}" for v in values), statistics.median(values)
                print(f"| {name} | {each} | {median:.2f} | {median / base:.2f}× |")
            print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    mem = sub.add_parser("memory")
    mem.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    rk = sub.add_parser("ranks")
    rk.add_argument("--texts", type=int, default=400)
    rk.add_argument("--repeats", type=int, default=3)
    win = sub.add_parser("windows")
    win.add_argument("--repeats", type=int, default=3)
    win.add_argument("--commands", nargs="+", choices=["context", "needle"], default=["context", "needle"])
    args = parser.parse_args()
    if args.what == "memory":
        memory(args.lengths)
    elif args.what == "windows":
        windows(args.repeats, args.commands)
    else:
        ranks(args.texts, args.repeats)


if __name__ == "__main__":
    main()
