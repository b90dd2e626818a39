"""Benchmark (issue 31 item 3): `posprobe.states` end to end vs `from_pretrained` + one forward pass with
`output_hidden_states` over the same texts, and the probe's finish (the nested cross-validated ridge of every hidden
state) now vs the previous Cholesky solves on the same statistics.

Model: the packaged SmolLM2-135M (31 hidden states of 576), as a safetensors folder made once from its GGUF
(`bench_states.smollm2_folder`), so both sides load the same files with `from_pretrained`. Texts: the first
`--texts` CoLA validation sentences (default 20 and 200: the issue's "20 sentences took 56 s").
- reference: `AutoModel.from_pretrained(folder)` + the forward passes (batches of 32, right padding,
  `output_hidden_states=True`, `torch.inference_mode`);
- posprobe: `posprobe.states(folder, texts)` — loading, tokenising, the pass, every reducer's result (positional
  vectors and their permutation null, probes with 5 control draws and the baseline, massive activations);
- the finish alone: `cross_validated_ridge` of every hidden state's statistics (now: one eigendecomposition per
  training set, dual form below d tokens) vs the previous way, copied here: a Cholesky factorisation per penalty
  (9 per training set), one solve per target with its own penalty.
Wall and CPU seconds, medians of `--repeats`, alternating; one torch thread.

    python benchmarks/bench_states_probe.py [--texts 20,200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def clocks(run) -> tuple[float, float, object]:
    start, cpu = time.perf_counter(), time.process_time()
    out = run()
    return time.perf_counter() - start, time.process_time() - cpu, out


def reference(folder: str, texts: list[str]) -> None:
    """from_pretrained + one forward pass with hidden states over the texts (tokenised in batches of 32)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.inference_mode():
        for start in range(0, len(texts), 32):
            batch = tokenizer(texts[start : start + 32], padding=True, truncation=True, max_length=128,
                              return_tensors="pt")  # fmt: skip
            model(**batch, output_hidden_states=True)


def cholesky_ridge(stats, grid):
    """The previous finish (before issue 31): per training set, a Cholesky factorisation of C + λI for each of the
    9 penalties; the outer refit solves once per target with that target's penalty. Returns the R²."""
    import numpy as np
    import torch

    from posprobe.analysis.position_probe import _centred, held_out_sse

    def solve(C, b, alphas):
        eye = torch.eye(C.shape[0], dtype=C.dtype)
        factor, _ = torch.linalg.cholesky_ex(C[None] + alphas[:, None, None] * eye)
        return torch.cholesky_solve(b.expand(len(alphas), *b.shape).contiguous(), factor)

    F, T = stats.count.shape[0], stats.ysum.shape[1]
    everything = stats.pooled(list(range(F)))
    _, _, C_all, _ = _centred(*everything[:5])
    alphas = torch.as_tensor(grid, dtype=torch.float64) * float(torch.trace(C_all)) / C_all.shape[0]
    inner = torch.zeros(F, len(grid), T, dtype=torch.float64)
    for f in range(F):
        for g in range(f + 1, F):
            mu, ybar, C, b = _centred(*stats.pooled([h for h in range(F) if h not in (f, g)])[:5])
            W = solve(C, b, alphas)
            inner[f] += held_out_sse(W, mu, ybar, stats.fold(g)) / stats.count[g]
            inner[g] += held_out_sse(W, mu, ybar, stats.fold(f)) / stats.count[f]
    best = torch.argmin(inner, dim=1)
    sse = np.zeros(T)
    for f in range(F):
        mu, ybar, C, b = _centred(*stats.pooled([h for h in range(F) if h != f])[:5])
        W = solve(C, b, alphas[best[f]])
        W = torch.stack([W[t, :, t] for t in range(T)], dim=1)[None]
        sse += held_out_sse(W, mu, ybar, stats.fold(f))[0].numpy()
    tss = (everything[5] - everything[4] ** 2 / everything[3]).numpy()
    return 1 - sse / tss


def finish(folder: str, texts: list[str]) -> dict:
    """The probe's statistics of every hidden state (one capture), then the finish both ways."""
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    from posprobe.analysis.position_probe import ALPHA_GRID, FoldStats, PositionProbeAccumulator, cross_validated_ridge
    from posprobe.capture import capture

    model = AutoModel.from_pretrained(folder).eval()
    L1, d = model.config.num_hidden_layers + 1, model.config.hidden_size
    acc = PositionProbeAccumulator(L1, list(range(L1)), d)
    capture(model, [acc], texts, tokenizer=AutoTokenizer.from_pretrained(folder), max_length=128, verify=False)
    stats = [FoldStats(acc.gram[p], acc.first[p], acc.cross[p], acc.count, acc.ysum, acc.ysq) for p in range(L1)]
    kept = min(acc.reservoir.seen, acc.reservoir.size)
    every = kept == int(acc.count.sum())

    def new():
        out = []
        for p, s in enumerate(stats):
            z = acc.sample_x[:kept, p].to(torch.float64) - acc.shift[p]
            tokens = (z, acc.sample_y[:kept], acc.sample_fold[:kept]) if every else None
            out.append(cross_validated_ridge(s, tokens=tokens).r2)
        return np.array(out)

    def old():
        return np.array([cholesky_ridge(s, ALPHA_GRID) for s in stats])

    w_new, c_new, r_new = clocks(new)
    w_old, c_old, r_old = clocks(old)
    return {
        "tokens": int(acc.count.sum()),
        "targets": int(acc.ysum.shape[1]),
        "new_s": (round(w_new, 2), round(c_new, 2)),
        "old_s": (round(w_old, 2), round(c_old, 2)),
        "max_r2_difference": float(np.nanmax(np.abs(r_new - r_old))),
    }


def main() -> None:
    import numpy as np
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", default="20,200")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import posprobe
    from benchmarks.bench_states import smollm2_folder

    folder = smollm2_folder()
    cola = [
        json.loads(line)["sentence"]
        for line in open(Path(__file__).resolve().parents[2] / "shared/data/glue/cola/validation.jsonl")
    ]
    report = {"threads": 1, "load_average_start": os.getloadavg()}
    for count in [int(x) for x in args.texts.split(",")]:
        texts = cola[:count]
        ref, ours = [], []
        for _ in range(args.repeats):
            ref.append(clocks(lambda texts=texts: reference(folder, texts))[:2])
            ours.append(clocks(lambda texts=texts: posprobe.states(folder, texts))[:2])
        med = lambda rows, i: float(np.median([r[i] for r in rows]))  # noqa: E731
        row = {
            "reference_wall_s": round(med(ref, 0), 2),
            "reference_cpu_s": round(med(ref, 1), 2),
            "states_wall_s": round(med(ours, 0), 2),
            "states_cpu_s": round(med(ours, 1), 2),
        }
        row["ratio_wall"] = round(row["states_wall_s"] / row["reference_wall_s"], 2)
        row["ratio_cpu"] = round(row["states_cpu_s"] / row["reference_cpu_s"], 2)
        row["finish"] = finish(folder, texts)
        report[f"{count} texts"] = row
        print(json.dumps({f"{count} texts": row}), flush=True)
    report["load_average_end"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
