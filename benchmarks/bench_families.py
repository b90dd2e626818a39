"""Lazy content-free scores of a rotary model vs building it with `from_pretrained` and hooking its attention.

    python benchmarks/bench_families.py [--layers 24] [--hidden 2048] [--positions 256] [--keep DIR]

Writes a random Llama-style checkpoint (GQA, bf16, safetensors) into a temporary folder, then runs, each in a
fresh Python process (the parent times the whole process, imports included; the child reports its peak RSS,
VmHWM, and its peak after importing torch and transformers, the baseline):

- posprobe: `posprobe.profiles(folder, layers='all', positions=n)`: the content-free scores of every head of
  every layer (SPEC §9), read lazily (word table a chunk at a time, then per layer its norm and Q/K weights);
  the child also reports the bytes of the tensors it read and its RSS after imports (the baseline);
- naive: `AutoModel.from_pretrained(folder)`, token 0 set to the average word, one forward over n copies of it
  with every layer fed the embedding-level input (pre-hooks) and the pre-softmax scores captured by an
  attention function registered in transformers' `AttentionInterface`, then the same diagonal means.

Both print the profiles' checksum: they must agree (to bf16/float32 precision of the naive forward).
"""

from __future__ import annotations

import argparse
import json
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
from posprobe.checkpoint import weights as W
from posprobe.checkpoint.safetensors_format import TensorEntry
base = hwm_kb()
read = {}
def nbytes(self, key):
    e = self._entries[key]
    return e.end - e.start
get, row_mean = W.WeightReader.get, W.WeightReader.row_mean
W.WeightReader.get = lambda self, key: (read.__setitem__(key, nbytes(self, key)), get(self, key))[1]
W.WeightReader.row_mean = lambda self, key, chunk_rows=1024: (
    read.__setitem__(key, nbytes(self, key)), row_mean(self, key, chunk_rows))[1]
r = posprobe.profiles(sys.argv[1], layers="all", positions=int(sys.argv[2]), window=4)
peak = hwm_kb()
print("RESULT", json.dumps({"checksum": float(np.abs(r.profiles).sum()), "shape": list(r.profiles.shape),
      "read_bytes": sum(read.values()), "base_kb": base, "peak_kb": peak}))
"""
)

NAIVE = (
    HWM
    + """
import sys, json
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
model = AutoModel.from_pretrained(sys.argv[1], attn_implementation="bench-record").eval()
with torch.no_grad():
    emb = model.get_input_embeddings()
    emb.weight[0] = emb.weight.float().mean(0).to(emb.weight.dtype)
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


def write_checkpoint(folder: Path, layers: int, hidden: int) -> int:
    """A random Llama-style checkpoint (bf16): returns its size in bytes."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    heads, kv_heads, inter, vocab = hidden // 128, max(1, hidden // 512), int(hidden * 2.75), 32000
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=inter, vocab_size=vocab,
                         max_position_embeddings=4096, dtype="bfloat16",
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=1024))  # fmt: skip
    config.save_pretrained(folder)
    g = torch.Generator().manual_seed(0)

    def rand(*shape, scale=0.02):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    dh = hidden // heads
    state = {"model.embed_tokens.weight": rand(vocab, hidden), "model.norm.weight": torch.ones(hidden).bfloat16()}
    for i in range(layers):
        p = f"model.layers.{i}."
        state |= {
            p + "input_layernorm.weight": 1 + rand(hidden, scale=0.1),
            p + "post_attention_layernorm.weight": 1 + rand(hidden, scale=0.1),
            p + "self_attn.q_proj.weight": rand(heads * dh, hidden),
            p + "self_attn.k_proj.weight": rand(kv_heads * dh, hidden),
            p + "self_attn.v_proj.weight": rand(kv_heads * dh, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * dh),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
        }
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return (folder / "model.safetensors").stat().st_size


def run(child: str, folder: Path, n: int) -> dict:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", child, str(folder), str(n)], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[7:]) | {"wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--keep", type=Path, default=None, help="write the checkpoint here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp) / "llama"
        folder.mkdir(parents=True, exist_ok=True)
        size = write_checkpoint(folder, args.layers, args.hidden)
        lazy = run(POSPROBE, folder, args.positions)
        naive = run(NAIVE, folder, args.positions)
    mib = 2**20
    print(f"checkpoint: {args.layers} layers, hidden {args.hidden}, {size / mib:.0f} MiB (bf16); n = {args.positions}")
    print(f"posprobe: {lazy['wall_s']:.1f} s, peak RSS {lazy['peak_kb'] / 1024:.0f} MiB "
          f"(after imports {lazy['base_kb'] / 1024:.0f} MiB; +{(lazy['peak_kb'] - lazy['base_kb']) / 1024:.0f} MiB), "
          f"tensors read {lazy['read_bytes'] / mib:.0f} MiB")  # fmt: skip
    print(f"naive:    {naive['wall_s']:.1f} s, peak RSS {naive['peak_kb'] / 1024:.0f} MiB "
          f"(after imports {naive['base_kb'] / 1024:.0f} MiB)")  # fmt: skip
    print(
        f"time ratio naive / posprobe: {naive['wall_s'] / lazy['wall_s']:.1f}x; "
        f"checksums {lazy['checksum']:.6g} vs {naive['checksum']:.6g}; shapes {lazy['shape']} {naive['shape']}"
    )


if __name__ == "__main__":
    main()
