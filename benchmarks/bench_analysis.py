"""Wall time and peak memory of `posprobe toeplitz` / `posprobe fhat` against the naive way.

Naive way = what a researcher would write without posprobe: `AutoModel.from_pretrained(folder)` (the whole
model), then the same numbers with torch. Every measurement runs in a fresh Python process; the parent
times the whole process (imports included) and the child reports its own peak RSS (ru_maxrss).

    python benchmarks/bench_analysis.py [--repeats 3]

Checkpoints: the packaged all-MiniLM-L6-v2, and a BERT-base-sized random checkpoint (default BertConfig,
saved as safetensors into a temporary folder by this script).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD_TAIL = "\nimport resource, json as _j; print('PEAK_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"

POSPROBE = """
import sys
from posprobe.cli import main
try:
    main([sys.argv[1], sys.argv[2], '--out', sys.argv[3], '--json'])
except SystemExit as e:
    assert not e.code
"""

NAIVE_TOEPLITZ = """
import sys, torch
from transformers import AutoModel
model = AutoModel.from_pretrained(sys.argv[2])
e = model.embeddings.position_embeddings.weight.detach().double()
p = e @ e.T
n = p.shape[0]
idx = torch.arange(n)
slot = (idx[None, :] - idx[:, None] + n - 1).reshape(-1)
means = torch.zeros(2 * n - 1, dtype=p.dtype).index_add_(0, slot, p.reshape(-1)) / (n - torch.arange(-(n - 1), n).abs())
fit = means[slot].reshape(n, n)
r2 = 1 - ((p - fit) ** 2).sum() / ((p - p.mean()) ** 2).sum()
print(float(r2))
"""

NAIVE_FHAT = """
import sys, torch
from transformers import AutoModel
model = AutoModel.from_pretrained(sys.argv[2])
emb = model.embeddings
ep = emb.position_embeddings.weight.detach().double()
ew = emb.word_embeddings.weight.detach().double().mean(0)
att = model.encoder.layer[0].attention.self
wq, wk = att.query.weight.detach().double(), att.key.weight.detach().double()
h = model.config.num_attention_heads
d = wq.shape[0]; dh = d // h
qp, kp = (ep @ wq.T).view(-1, h, dh).transpose(0, 1), (ep @ wk.T).view(-1, h, dh).transpose(0, 1)
qw, kw = (ew @ wq.T).view(h, dh), (ew @ wk.T).view(h, dh)
f = qp @ kp.transpose(1, 2) + (qw[:, None, :] * kp).sum(-1)[:, None, :] + (qp * kw[:, None, :]).sum(-1)[:, :, None]
f = f / dh**0.5
n = f.shape[-1]
idx = torch.arange(n)
slot = (idx[None, :] - idx[:, None] + n - 1).reshape(-1)
cnt = n - torch.arange(-(n - 1), n).abs()
r2 = []
for m in f:
    means = torch.zeros(2 * n - 1, dtype=m.dtype).index_add_(0, slot, m.reshape(-1)) / cnt
    r2.append(float(1 - ((m - means[slot].reshape(n, n)) ** 2).sum() / ((m - m.mean()) ** 2).sum()))
print(r2)
"""


def measure(code: str, command: str, folder: str, out: str) -> tuple[float, float]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code + CHILD_TAIL, command, folder, out], capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - start
    peak_kb = int(next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("PEAK_KB")))
    return wall, peak_kb / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from posprobe.checkpoint import default_model_dir

    tmp = Path(tempfile.mkdtemp())
    base = tmp / "bert-base-random"
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, transformers as t; t.BertModel(t.BertConfig()).save_pretrained(sys.argv[1])",
            str(base),
        ],
        check=True,
        capture_output=True,
    )
    models = {"all-MiniLM-L6-v2 (packaged)": str(default_model_dir()), "BERT-base random (110M)": str(base)}
    rows = []
    for label, folder in models.items():
        for command, naive in (("toeplitz", NAIVE_TOEPLITZ), ("fhat", NAIVE_FHAT)):
            ours, ref = [], []
            for _ in range(args.repeats):  # interleave to share any machine noise
                ours.append(measure(POSPROBE, command, folder, str(tmp / "out")))
                ref.append(measure(naive, command, folder, str(tmp / "out")))
            ow, om = statistics.median(w for w, _ in ours), statistics.median(m for _, m in ours)
            rw, rm = statistics.median(w for w, _ in ref), statistics.median(m for _, m in ref)
            rows.append((label, command, ow, rw, ow / rw, om, rm, om / rm))
            print(
                f"{label:28s} {command:8s} wall {ow:6.2f}s vs {rw:6.2f}s ({ow / rw:.2f}x)  "
                f"peak {om:7.0f} MiB vs {rm:7.0f} MiB ({om / rm:.2f}x)",
                flush=True,
            )
    help_times = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "posprobe", "--help"], check=True, capture_output=True)
        help_times.append(time.perf_counter() - start)
    print(f"posprobe --help: median {statistics.median(help_times):.3f}s over 5 runs")
    print(json.dumps({"rows": rows, "help_seconds": statistics.median(help_times)}))


if __name__ == "__main__":
    main()
