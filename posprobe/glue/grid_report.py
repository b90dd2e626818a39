"""Reporting a fine-tuning grid (tasks x mechanisms x seeds): the SPEC §12 summary, Markdown tables and
`GridResult`.

Pure Python (numpy/scipy through `stats`); no torch, transformers or rich. `runs` are the per-seed records
`{task, mechanism, seed, metrics}`; the summary has one row per (task, metric, mechanism) with median, mean,
s.e., n and `delta` (paired differences against the first mechanism, the baseline; None for the baseline).
With two or more tasks an `average` task is added: per seed, the mean over tasks of each task's main metric
(TISA Table 3's average column), summarised and paired the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posprobe.glue.report import fmt
from posprobe.glue.stats import paired_delta, summarize

AVERAGE = "average"


def seed_values(runs: list[dict], task: str, mechanism: str, metric: str, seeds: Sequence[int]) -> list[float | None]:
    """The metric per seed (aligned with `seeds`; None where the seed is missing or the metric undefined)."""
    by_seed = {r["seed"]: r["metrics"] for r in runs if r["task"] == task and r["mechanism"] == mechanism}
    return [(by_seed.get(s) or {}).get(metric) for s in seeds]


def average_seed_values(
    runs: list[dict], tasks: Sequence[str], main_metrics: dict[str, str], mechanism: str, seeds: Sequence[int]
) -> list[float | None]:
    """Per seed, the mean over `tasks` of each task's main metric (None where a task lacks it)."""
    per_task = [seed_values(runs, t, mechanism, main_metrics[t], seeds) for t in tasks]
    return [None if any(v is None for v in col) else sum(col) / len(col) for col in zip(*per_task)]


def grid_summary(
    runs: list[dict],
    tasks: Sequence[str],
    mechanisms: Sequence[str],
    metrics: dict[str, list[str]],
    seeds: Sequence[int],
) -> list[dict[str, Any]]:
    """SPEC §12 rows `{task, mechanism, metric, median, mean, stderr, n, delta}`; `metrics[task]` lists the
    task's metric names, the first being its main metric (used for the average over tasks)."""
    rows = []
    base = mechanisms[0]
    groups = [(t, m) for t in tasks for m in metrics[t]]
    if len(tasks) > 1:
        groups.append((AVERAGE, AVERAGE))
    main_metrics = {t: metrics[t][0] for t in tasks}

    def values(task: str, metric: str, mechanism: str) -> list[float | None]:
        if task == AVERAGE:
            return average_seed_values(runs, tasks, main_metrics, mechanism, seeds)
        return seed_values(runs, task, mechanism, metric, seeds)

    for task, metric in groups:
        baseline = values(task, metric, base)
        for mechanism in mechanisms:
            own = values(task, metric, mechanism)
            s = summarize(own)
            delta = None
            if mechanism != base:
                d = paired_delta(own, baseline)
                delta = None if d is None else d.to_dict()
            rows.append(
                {
                    "task": task,
                    "mechanism": mechanism,
                    "metric": metric,
                    "median": s.median,
                    "mean": s.mean,
                    "stderr": s.stderr,
                    "n": s.n,
                    "delta": delta,
                }
            )
    return rows


def _pm(mean: float | None, stderr: float | None) -> str:
    return fmt(mean) if stderr is None else f"{fmt(mean)} ± {fmt(stderr)}"


def _delta_text(delta: dict | None) -> str:
    if delta is None:
        return "—"
    ci = delta.get("ci95")
    text = f"{delta['mean']:+.4f}" + ("" if delta.get("stderr") is None else f" ± {delta['stderr']:.4f}")
    if ci is not None:
        text += f" [{ci[0]:+.4f}, {ci[1]:+.4f}]"
    # exact for N <= 20 seeds (all 2^N sign patterns); above, a Monte Carlo estimate: "p ≈"
    return text + f", p {'=' if delta.get('p_exact', True) else '≈'} {delta['p_value']:.3g}"


def summary_tables(result: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the three tables shared by results.md and the CLI: main metrics (rows:
    mechanisms; columns: tasks and their average; median and mean ± s.e.), paired differences against the
    baseline, and every metric."""
    rows = result["summary"]
    tasks = list(result["tasks"]) + ([AVERAGE] if len(result["tasks"]) > 1 else [])
    main = {t: m for t, m in result["main_metrics"].items()} | {AVERAGE: AVERAGE}
    cell = {(r["task"], r["mechanism"], r["metric"]): r for r in rows}
    cols = [f"{t} ({main[t]})" if t != AVERAGE else AVERAGE for t in tasks]
    t1 = [[m, *(_median_mean(cell.get((t, m, main[t]))) for t in tasks)] for m in result["mechanisms"]]
    base = result["mechanisms"][0]
    t2 = [
        [m, *(_delta_text((cell.get((t, m, main[t])) or {}).get("delta")) for t in tasks)]
        for m in result["mechanisms"][1:]
    ]
    t3 = [
        [
            r["task"],
            r["metric"],
            r["mechanism"],
            fmt(r["median"]),
            _pm(r["mean"], r["stderr"]),
            str(r["n"]),
            _delta_text(r["delta"]) if r["mechanism"] != base else "baseline",
        ]
        for r in rows
    ]
    return [
        ("median; mean ± s.e. over seeds", ["mechanism", *cols], t1),
        (f"paired difference vs `{base}`: mean ± s.e. [95% t interval], sign-flip p", ["mechanism", *cols], t2),
        ("all metrics", ["task", "metric", "mechanism", "median", "mean ± s.e.", "n", f"Δ vs {base}"], t3),
    ]


def zero_runs(result: dict[str, Any]) -> dict[tuple[str, str], tuple[int, int]]:
    """(task, mechanism) -> (runs whose main metric is exactly 0, runs with the metric defined), from `runs`; for
    Matthews correlation, 0 exactly is a constant prediction (the majority class). Input: `GridResult.to_dict()`."""
    counts = {}
    runs = result.get("runs") or []  # a summary-only record has none
    for task in result["tasks"]:
        metric = result["main_metrics"][task]
        for mechanism in result["mechanisms"]:
            values = [v for v in seed_values(runs, task, mechanism, metric, result["seeds"]) if v is not None]
            counts[(task, mechanism)] = (sum(1 for v in values if v == 0), len(values))
    return counts


def cell_differences(result: dict[str, Any]) -> list[str]:
    """'init (none, composite: zero; tisa: fit)'-style phrases, one per setting the cells do not share (from each run's
    own `settings`); empty when the runs carry none or all agree."""
    per_cell: dict[str, dict[str, Any]] = {}
    for run in result.get("runs") or []:
        per_cell.setdefault(run["mechanism"], run.get("settings") or {})
    keys = sorted({k for s in per_cell.values() for k in s})
    phrases = []
    for key in keys:
        values = {m: s.get(key) for m, s in per_cell.items()}
        if len({repr(v) for v in values.values()}) < 2:
            continue
        groups: dict[str, list[str]] = {}
        for mechanism, value in values.items():
            groups.setdefault("unset" if value is None else str(value), []).append(mechanism)
        phrases.append(f"{key} (" + "; ".join(f"{', '.join(ms)}: {v}" for v, ms in groups.items()) + ")")
    return phrases


def _median_mean(row: dict | None) -> str:
    if row is None:
        return "n/a"
    return f"{fmt(row['median'])}; {_pm(row['mean'], row['stderr'])}"


def grid_markdown(result: dict[str, Any]) -> str:
    """results.md of a grid: settings line, then the three summary tables."""
    lines = [
        f"# GLUE grid — {', '.join(result['tasks'])} × {', '.join(result['mechanisms'])}",
        "",
        f"Model: `{result.get('model')}`; seeds: {', '.join(map(str, result['seeds']))} (the same seeds and data "
        f"order for every mechanism, so differences are paired); fine-tuning time of all runs "
        f"{result.get('run_seconds', result['seconds']):.0f} s (this call: {result['seconds']:.1f} s). Metrics "
        "are fractions (x100 for the usual percentages). Baseline: the first mechanism. p: exact two-sided "
        "sign-flip test of the mean paired difference (SPEC §12).",
    ]
    differences = cell_differences(result)
    if differences:
        lines += ["", f"Cells differ in {', '.join(differences)} (each run's `settings` in results.json)."]
    zeros = {cell: z for cell, z in zero_runs(result).items() if z[0]}
    if zeros:
        lines += [
            "",
            "Runs whose main metric is exactly 0 (for MCC a constant prediction, the majority class): "
            + ", ".join(f"{t} × {m} {k} of {n}" for (t, m), (k, n) in zero_runs(result).items())
            + ".",
        ]
    for title, header, rows in summary_tables(result):
        lines += ["", f"## {title}", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class GridResult:
    """The outcome of `finetune_grid()`: per-seed runs, the SPEC §12 summary, and each cell's run folder
    (`cells[(task, mechanism)]`, a `finetune` run folder). `to_dict()` is the CLI's `--json`."""

    tasks: list[str]
    mechanisms: list[str]
    model: str
    seeds: list[int]
    main_metrics: dict[str, str]
    runs: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    seconds: float
    run_seconds: float  # sum of every run's own wall time (earlier calls included; `seconds`: this call)
    out: Path
    cells: dict[tuple[str, str], Path]
    settings: dict[str, Any] = field(repr=False, default_factory=dict)

    def to_dict(self, settings: bool = False) -> dict[str, Any]:
        out = {
            "tasks": list(self.tasks),
            "mechanisms": list(self.mechanisms),
            "baseline": self.mechanisms[0],
            "model": self.model,
            "seeds": list(self.seeds),
            "main_metrics": dict(self.main_metrics),
            "runs": [dict(r) for r in self.runs],
            "summary": [dict(r) for r in self.summary],
            "seconds": self.seconds,
            "run_seconds": self.run_seconds,
            "out": str(self.out),
            "cells": {f"{t}-{m}": str(p) for (t, m), p in self.cells.items()},
        }
        if settings:
            out["settings"] = dict(self.settings)
        return out

    def __repr__(self) -> str:
        return (
            f"GridResult(tasks={self.tasks}, mechanisms={self.mechanisms}, seeds={self.seeds}, "
            f"runs={len(self.runs)}, out='{self.out}')"
        )


def grid_panels(result: dict) -> list[tuple[str, np.ndarray, list[tuple[float, float | None] | None]]]:
    """What the grid figure draws, per task (plus `average` with two or more tasks): its title, the values
    (seeds, mechanisms) of its main metric with NaN where a run is missing or undefined, and per mechanism the
    summary's (mean, s.e.) or None. Input: `GridResult.to_dict()`."""
    tasks = list(result["tasks"]) + ([AVERAGE] if len(result["tasks"]) > 1 else [])
    main = dict(result["main_metrics"]) | {AVERAGE: AVERAGE}
    summary = {(r["task"], r["mechanism"], r["metric"]): r for r in result["summary"]}
    seeds, runs = list(result["seeds"]), result["runs"]
    panels = []
    for task in tasks:
        metric = main[task]
        columns = [  # per mechanism, its value for every seed (None: missing or undefined)
            average_seed_values(runs, result["tasks"], main, m, seeds)
            if task == AVERAGE
            else seed_values(runs, task, m, metric, seeds)
            for m in result["mechanisms"]
        ]
        values = np.array([[np.nan if v is None else float(v) for v in col] for col in columns]).T
        rows = [summary.get((task, m, metric)) for m in result["mechanisms"]]
        means = [None if r is None or r["mean"] is None else (r["mean"], r["stderr"]) for r in rows]
        panels.append((f"{task} ({metric})" if task != AVERAGE else "average over tasks", values, means))
    return panels
