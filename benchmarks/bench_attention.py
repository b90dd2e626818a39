"""Benchmark: `posprobe attention` vs a plain eager forward pass with `output_attentions` over the same texts.

Model: the packaged all-MiniLM-L6-v2 (6 layers x 12 heads). Texts: the shared GLUE validation sentences
(CoLA, then SST-2), tokenised once outside the timings; every side gets the same batches (sorted by length in
chunks, right padding) and runs under `torch.inference_mode`.
- baseline: `model(input_ids, attention_mask, output_attentions=True)` per batch, eager attention;
- posprobe: `attention_profiles(model, input_ids=...)`: the capture layer (recording attention, the check against
  eager attention on the first batch) + both reducers (SPEC §10 profiles and SPEC §14 sinks) + the final
  statistics (profiles, mean distance, Toeplitz R^2, sink measures);
- profiles only / sinks only: `posprobe.capture.capture` with one of the two reducers, to split the cost.
Timings alternate between the sides and are repeated (the machine is shared): medians reported.
Peak memory during the run (VmHWM of a fresh process, reset after loading the model) over one pass and four
passes of all the CoLA + SST-2 sentences shows that memory does not grow with the number of texts.

    python benchmarks/bench_attention.py [--texts 1024] [--max-length 128] [--batch-size 32] [--repeats 5]
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
# the shared data beside the checkout (main) or beside the folder of worktrees
DATA = next(
    (p / "shared" / "data" / "glue" for p in (ROOT.parent, ROOT.parent.parent) if (p / "shared" / "data").is_dir()),
    ROOT.parent / "shared" / "data" / "glue",
)
ALL_TEXTS = 1043 + 1821  # CoLA + SST-2 validation sentences


def token_ids(count: int, max_length: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from posprobe.checkpoint.resolve import default_model_dir
    from posprobe.texts.reading import iter_texts

    texts = []
    for task in ("cola", "sst2"):
        for text in iter_texts(DATA / task / "validation.jsonl", "sentence"):
            texts.append(text)
    texts = (texts * (count // len(texts) + 1))[:count]
    tok = AutoTokenizer.from_pretrained(str(default_model_dir()))
    return tok(texts, truncation=True, max_length=max_length)["input_ids"]


def baseline(model, ids, batch_size: int) -> tuple[float, float]:
    import torch

    from posprobe.capture import id_tokenizer, token_batches

    model.set_attn_implementation("eager")
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for batch in token_batches(ids, id_tokenizer((), 10**9), batch_size=batch_size, pad_id=0):
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)
    return time.perf_counter() - start, time.process_time() - cpu


def ours(model, ids, max_length: int, batch_size: int) -> tuple[float, float]:
    from posprobe.pipelines.attention import attention_profiles

    start, cpu = time.perf_counter(), time.process_time()
    attention_profiles(model, input_ids=ids, max_length=max_length, batch_size=batch_size)
    return time.perf_counter() - start, time.process_time() - cpu


def one_reducer(model, ids, max_length: int, batch_size: int, which: str) -> tuple[float, float]:
    from posprobe.analysis.empirical import EmpiricalAccumulator
    from posprobe.analysis.sinks import SinkAccumulator
    from posprobe.capture import capture

    start, cpu = time.perf_counter(), time.process_time()
    if which == "profiles":
        reducer = EmpiricalAccumulator(6, 12, max_length)
    else:
        reducer = SinkAccumulator(6, 12)
    capture(model, [reducer], input_ids=ids, max_length=max_length, batch_size=batch_size)
    reducer.result()
    return time.perf_counter() - start, time.process_time() - cpu


def peak_memory(count: int, max_length: int, batch_size: int) -> tuple[float, float]:
    """(MiB resident after loading, MiB peak during the measurement) of a fresh process measuring `count` texts.

    The peak is the kernel's high-water mark (VmHWM), reset after loading (`/proc/self/clear_refs`), so that the
    loading peak does not hide the run's."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from benchmarks.bench_attention import token_ids, _status_mib;"
        "from posprobe.pipelines.attention import attention_profiles;"
        "from posprobe.retrofitting.loading import load_model;"
        "ids = token_ids(int(sys.argv[2]), int(sys.argv[3]));"
        "m = load_model(None, attn_implementation='eager');"
        "open('/proc/self/clear_refs', 'w').write('5');"
        "r0 = _status_mib('VmRSS');"
        "attention_profiles(m, input_ids=iter(ids), max_length=int(sys.argv[3]), batch_size=int(sys.argv[4]));"
        "print(r0, _status_mib('VmHWM'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), str(count), str(max_length), str(batch_size)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), float(out[1])


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    args = parser.parse_args()
    import torch

    from posprobe.analysis.empirical import EmpiricalAccumulator
    from posprobe.retrofitting.loading import load_model

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    ids = token_ids(args.texts, args.max_length)
    model = load_model(None, attn_implementation="eager").eval()
    base_t, ours_t, profiles_t, sinks_t = [], [], [], []
    baseline(model, ids[: args.batch_size * 2], args.batch_size)  # warm-up
    for _ in range(args.repeats):
        base_t.append(baseline(model, ids, args.batch_size))
        ours_t.append(ours(model, ids, args.max_length, args.batch_size))
        profiles_t.append(one_reducer(model, ids, args.max_length, args.batch_size, "profiles"))
        sinks_t.append(one_reducer(model, ids, args.max_length, args.batch_size, "sinks"))
    small, large = ALL_TEXTS, 4 * ALL_TEXTS  # the same length distribution (whole passes), 4x the texts
    mem_small, mem_large = (
        peak_memory(small, args.max_length, args.batch_size),
        peak_memory(large, args.max_length, args.batch_size),
    )
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
        "texts": args.texts,
        "tokens": sum(map(len, ids)),
        "max_length": args.max_length,
        "batch_size": args.batch_size,
        "wall_baseline_s": [round(t[0], 3) for t in base_t],
        "wall_posprobe_s": [round(t[0], 3) for t in ours_t],
        "cpu_baseline_s": [round(t[1], 3) for t in base_t],
        "cpu_posprobe_s": [round(t[1], 3) for t in ours_t],
        "cpu_profiles_only_s": [round(t[1], 3) for t in profiles_t],
        "cpu_sinks_only_s": [round(t[1], 3) for t in sinks_t],
        "median_wall_ratio": _median_ratio(base_t, ours_t, 0),
        "median_cpu_ratio": _median_ratio(base_t, ours_t, 1),
        "median_cpu_ratio_profiles_only": _median_ratio(base_t, profiles_t, 1),
        "median_cpu_ratio_sinks_only": _median_ratio(base_t, sinks_t, 1),
        "accumulator_mib": round(EmpiricalAccumulator.nbytes(6, 12, args.max_length) / 2**20, 1),
        "rss_mib": {
            f"{small} texts": {"after load": round(mem_small[0]), "peak during run": round(mem_small[1])},
            f"{large} texts": {"after load": round(mem_large[0]), "peak during run": round(mem_large[1])},
        },
    }
    print(json.dumps(report, indent=2))


def _median_ratio(base: list, ours_: list, index: int) -> dict:
    import numpy as np

    b, o = np.array([t[index] for t in base]), np.array([t[index] for t in ours_])
    return {"of_medians": round(float(np.median(o) / np.median(b)), 3), "paired": round(float(np.median(o / b)), 3)}


if __name__ == "__main__":
    main()
