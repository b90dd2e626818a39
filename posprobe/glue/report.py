"""Reporting GLUE runs: aggregates over seeds (SPEC §12), the Markdown table, and `FinetuneResult`.

Pure Python: no torch, transformers or rich (the CLI draws its own table from the same numbers).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posprobe.errors import ArgumentValueError


def aggregate(per_seed: Sequence[dict[str, float | None]]) -> dict[str, dict[str, float | None]]:
    """Median, mean and standard error (sample s.d. / sqrt(n); None for one seed) of every metric, over the
    seeds where it is defined; `n` counts those seeds."""
    names = list(per_seed[0]) if per_seed else []
    out: dict[str, dict[str, float | None]] = {"median": {}, "mean": {}, "stderr": {}, "n": {}}
    for name in names:
        values = [float(m[name]) for m in per_seed if m.get(name) is not None and not math.isnan(float(m[name]))]
        out["n"][name] = len(values)  # seeds whose metric was defined (a constant prediction has no correlation)
        if not values:
            out["median"][name] = out["mean"][name] = out["stderr"][name] = None
            continue
        out["median"][name] = float(statistics.median(values))
        out["mean"][name] = float(statistics.fmean(values))
        out["stderr"][name] = float(statistics.stdev(values) / math.sqrt(len(values))) if len(values) > 1 else None
    return out


def fmt(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def counted(result: dict[str, Any], name: str) -> int:
    """Seeds whose `name` was defined (an undefined correlation, from constant predictions, is left out)."""
    return int(result.get("n", {}).get(name, len(result["metrics"])))


def table_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(metric names, rows): one row per seed, then median, mean ± s.e. and seeds counted (each row starts
    with its label). Shared by the Markdown file and the CLI's table."""
    names = list(result["metrics"][0]) if result["metrics"] else []
    rows = [[str(seed), *(fmt(m.get(n)) for n in names)] for seed, m in zip(result["seeds"], result["metrics"])]
    rows.append(["median", *(fmt(result["median"].get(n)) for n in names)])
    rows.append(["mean ± s.e.", *(f"{fmt(result['mean'].get(n))} ± {fmt(result['stderr'].get(n))}" for n in names)])
    rows.append(["seeds counted", *(str(counted(result, n)) for n in names)])
    return names, rows


def results_markdown(result: dict[str, Any]) -> str:
    """A Markdown table: one row per seed (with its wall time), then median and mean ± s.e. (fractions)."""
    names, rows = table_rows(result)
    lines = [
        f"# GLUE {result['task']} — mechanism `{result['mechanism']}`",
        "",
        f"Model: `{result.get('model')}`; seeds: {', '.join(map(str, result['seeds']))}; "
        f"wall time {result['seconds']:.1f} s. Metrics are fractions (x100 for the usual percentages).",
        "",
        "| seed | " + " | ".join(names) + " | seconds |",
        "|---|" + "---|" * len(names) + "---|",
    ]
    times = list(result.get("seconds_per_seed") or [])
    for i, row in enumerate(rows):
        secs = times[i] if i < len(result["seeds"]) and i < len(times) else None
        lines.append("| " + " | ".join(row) + f" | {'' if secs is None else f'{secs:.1f}'} |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class FinetuneResult:
    """The outcome of `finetune()`: per-seed dev metrics, their aggregates, and the saved models.

    `metrics[i]` holds the metrics of `seeds[i]` (fractions; None where undefined); `median`, `mean`,
    `stderr` and `n` map each metric name to its aggregate over seeds; `model_dirs[seed]` is the folder of
    the model fine-tuned with that seed (load it with `load_model(seed)`). `to_dict()` is the CLI's `--json`.
    """

    task: str
    mechanism: str
    model: str
    seeds: list[int]
    metrics: list[dict[str, float | None]]
    median: dict[str, float | None]
    mean: dict[str, float | None]
    stderr: dict[str, float | None]
    n: dict[str, int]
    seconds: float
    seconds_per_seed: list[float]
    world_size: int
    out: Path
    model_dirs: dict[int, Path]
    settings: dict[str, Any] = field(repr=False, default_factory=dict)

    def to_dict(self, settings: bool = False) -> dict[str, Any]:
        """JSON-ready dict: the object `posprobe finetune --json` prints (with `settings=True`, also the run's
        settings, as results.json holds them)."""
        out = {
            "task": self.task,
            "mechanism": self.mechanism,
            "model": self.model,
            "seeds": list(self.seeds),
            "metrics": [dict(m) for m in self.metrics],
            "median": dict(self.median),
            "mean": dict(self.mean),
            "stderr": dict(self.stderr),
            "n": dict(self.n),
            "seconds": self.seconds,
            "seconds_per_seed": list(self.seconds_per_seed),
            "world_size": self.world_size,
            "out": str(self.out),
            "models": {str(s): str(p) for s, p in self.model_dirs.items()},
        }
        if settings:
            out["settings"] = dict(self.settings)
        return out

    def load_model(self, seed: int | None = None, **kwargs):
        """The model fine-tuned with `seed` (default: the first seed), with its mechanism re-installed."""
        from posprobe.glue.runtime import load_classifier, quiet

        seed = self.seeds[0] if seed is None else seed
        if seed not in self.model_dirs:
            raise ArgumentValueError(
                "seed", f"no model for {{arg}} {seed!r}", f"this run has seeds {', '.join(map(str, self.seeds))}"
            )
        with quiet():
            return load_classifier(self.model_dirs[seed], **kwargs)

    def __repr__(self) -> str:
        main = self.metrics[0] if self.metrics else {}
        parts = []
        for name in main:
            value = self.median.get(name)
            text = fmt(value)
            if len(self.seeds) > 1 and self.stderr.get(name) is not None:
                text = f"{fmt(self.mean.get(name))} ± {fmt(self.stderr.get(name))} (median {text})"
            parts.append(f"{name}={text}")
        return (
            f"FinetuneResult(task={self.task!r}, mechanism={self.mechanism!r}, model={self.model!r}, "
            f"seeds={self.seeds}, {', '.join(parts)}, out='{self.out}')"
        )
