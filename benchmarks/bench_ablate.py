"""Benchmark (issue 46): the cost of `posprobe ablate` as a ratio to (1 + E + C) plain readouts, on the packaged
SmolLM2 GGUF, loaded once in this process.

Paired and alternated, `REPEATS` times: A = one readout as its command runs it (`needle` on the grid below;
`context` at one length on the same windows), B = `ablate` with E edits and C control seeds on the same grid or
windows; the ratio is B / ((1 + E + C) x A), A and B timed next to each other. Prints one JSON line per readout.

    OMP_NUM_THREADS=2 python benchmarks/bench_ablate.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

REPEATS = 3


def main() -> None:
    from conftest import smollm2_gguf_path

    from posprobe.capture.model import place_on, resolve_device
    from posprobe.checkpoint import resolve_model
    from posprobe.checkpoint.loading import load_tokenizer
    from posprobe.pipelines.ablate import _windows, ablate
    from posprobe.pipelines.context import context
    from posprobe.pipelines.needle import NeedleGrid, _load_causal_lm, needle

    source = resolve_model(str(smollm2_gguf_path()), with_tokenizer=True)
    tokenizer = load_tokenizer(source.path, "")
    net = place_on(_load_causal_lm(source, {}), resolve_device("cpu"))
    grid = NeedleGrid(lengths=(256,), depths=(0.0, 0.5, 1.0), trials=2)
    windows = _windows("builtin:kjv", tokenizer, 256, 4)
    documents = [w[1:] if w[0] == tokenizer.bos_token_id else w for w in windows]
    cases = {
        "needle": (
            lambda: needle(net, tokenizer=tokenizer, grid=grid),
            lambda: ablate(net, ["head:retrieval:10"], readout="needle", tokenizer=tokenizer, grid=grid, control=10,
                           seeds=2),
            1, 2,
        ),
        "context": (
            lambda: context(net, [256], documents=documents, windows=4, bos_id=tokenizer.bos_token_id),
            lambda: ablate(net, ["head:3.1,5.2", "attend:4,60"], readout="context", tokenizer=tokenizer, length=256,
                           windows=4, control=2, seeds=2),
            2, 2,
        ),
    }  # fmt: skip
    if "--own" in sys.argv:  # B / the sum of the same runs' own readouts (each `needle` with that run's edits)
        own_readouts(net, tokenizer, grid, cases["needle"][1])
        return
    for name, (single, study, edits, controls) in cases.items():
        ratios, a_times, b_times = [], [], []
        for _ in range(REPEATS):
            start = time.perf_counter()
            single()
            a = time.perf_counter() - start
            start = time.perf_counter()
            study()
            b = time.perf_counter() - start
            a_times.append(a)
            b_times.append(b)
            ratios.append(b / ((1 + edits + controls) * a))
        print(json.dumps({"readout": name, "E": edits, "C": controls, "readout_s": a_times, "ablate_s": b_times,
                          "ratios": ratios, "median_ratio": statistics.median(ratios)}))  # fmt: skip


def own_readouts(net, tokenizer, grid, study) -> None:
    """`ablate --readout needle` against the sum of its runs' own readouts: each run (baseline, the edit with its heads
    resolved, each control) as one plain `needle` call with that run's edits, timed right after the study. An
    edited run that breaks the answer does more work in either way (a greedy continuation, one more pass for Wu's
    score), so this is the like-for-like ratio; the one above divides by (1 + E + C) unedited readouts."""
    from posprobe.pipelines.needle import needle

    ratios = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        result = study()
        b = time.perf_counter() - start
        per_run = {}
        for run in result.all_runs:
            start = time.perf_counter()
            needle(net, tokenizer=tokenizer, grid=grid, edits=list(run.edits) or None)
            per_run[run.label] = time.perf_counter() - start
        a = sum(per_run.values())
        ratios.append(b / a)
        print(json.dumps({"readout": "needle", "runs": len(result.all_runs), "ablate_s": b, "own_readouts_s": a,
                          "ratio": b / a, "own_readout_s_per_run": per_run}), flush=True)  # fmt: skip
    print(json.dumps({"readout": "needle", "median_ratio_to_own_readouts": statistics.median(ratios)}))


if __name__ == "__main__":
    main()
