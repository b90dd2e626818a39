"""The result of `posprobe ablate` (issue 46): `Run` (one run's per-window or per-prompt values and what it
measured) and `AblateResult` (the baseline, the edits' runs and the controls, with their paired statistics, JSON
record, table, files and figures).

Dimensions: n windows or prompts, m window length, L layers, H heads, Lg lengths, D depths.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

import numpy as np

from posprobe.analysis.ablate import against_controls, paired_effect, top_heads
from posprobe.formats.arrays import optional
from posprobe.formats.save import OutputFile, Saves, arrays_file, figure_file, text_file
from posprobe.results import ResultMixin

TOP_RETRIEVAL = 10


@dataclass(frozen=True)
class Run:
    """One run: `label` (the edit as given, 'baseline', 'control seed s'), `edits` (as applied, selections
    resolved), `heads` [[layer, head], ...] the head edits act on, `units` (n,) the compared value per window or
    prompt; needle: `exact` (n,) 0/1, `retrieval` (n, L, H) Wu's score, `grid` (mean log-prob, accuracy) each
    (Lg, D); context: `position_loss` (m - 1,) the mean loss predicting the token at each position 1..m-1;
    `first_token_mass` (L, H) where read; `head_scores` the per-head measures selections rank by; a control's
    `seed` and `bands`."""

    label: str
    edits: list
    heads: list
    units: np.ndarray
    exact: np.ndarray | None = None
    retrieval: np.ndarray | None = None
    grid: tuple | None = None
    position_loss: np.ndarray | None = None
    first_token_mass: np.ndarray | None = None
    head_scores: dict = field(default_factory=dict)
    seed: int | None = None
    bands: list | None = None
    seconds: float | None = None  # wall-clock seconds of the run (its readout with its edits)

    @property
    def value(self) -> float:
        return float(np.mean(self.units))

    def with_seed(self, seed: int, bands: list | None = None) -> Run:
        return replace(self, seed=seed, bands=bands)


@dataclass(frozen=True, repr=False)
class AblateResult(ResultMixin, Saves):
    """The baseline, each edit's run (`runs`, in the order given) and the control runs (`controls`, one per seed, of
    the run labelled `control_of`), all on the same windows or prompts; `settings` the readout's options."""

    model: str
    readout: str
    metric: str
    n_layers: int
    n_heads: int
    baseline: Run
    runs: list
    controls: list
    control_of: str | None
    settings: dict
    records: list | None = None  # needle: the baseline's prompts.jsonl records

    _repr_fields = ("model", "readout", "metric")

    @property
    def all_runs(self) -> list[Run]:
        return [self.baseline, *self.runs, *self.controls]

    def effect(self, run: Run) -> dict:
        """The paired effect of `run` against the baseline (delta, interval, p, ...)."""
        return paired_effect(run.units, self.baseline.units)

    def retrieval_heads(self) -> list[tuple[int, int]]:
        """The baseline's top heads by Wu's retrieval score (needle)."""
        scores = self.baseline.head_scores.get("retrieval")
        return [] if scores is None else top_heads(scores, TOP_RETRIEVAL)

    def _details(self, run: Run) -> dict:
        if self.readout == "context":
            return {"perplexity": _number(math.exp(run.value))}
        if self.readout == "needle":
            top = self.retrieval_heads()
            score = None
            if top and run.retrieval is not None:
                score = float(np.nanmean([run.retrieval[:, a, b] for a, b in top]))
            return {"exact_match": _number(np.mean(run.exact)), "retrieval_score_top_heads": _number(score)}
        return {}

    def versus_controls(self) -> dict | None:
        """The target's effect against the controls' distribution, with the paired comparison (`against_controls`)."""
        if not self.controls:
            return None
        target = next(r for r in self.runs if r.label == self.control_of)
        found = against_controls(target.units, np.stack([c.units for c in self.controls]), self.baseline.units)
        return {"target": target.label} | found

    def to_dict(self) -> dict:
        runs = []
        for run in self.runs:
            effect = self.effect(run)
            runs.append(
                {
                    "edit": run.label,
                    "applied": list(run.edits),
                    "heads": [list(h) for h in run.heads],
                    "value": _number(run.value),
                    **_effect(effect),
                    **self._details(run),
                }
            )
        controls = []
        for run in self.controls:
            effect = self.effect(run)
            where = {"bands": list(run.bands)} if run.bands is not None else {"heads": [list(h) for h in run.heads]}
            controls.append(
                {
                    "seed": run.seed,
                    **where,
                    "edit": run.edits[0] if len(run.edits) == 1 else run.edits,
                    "value": _number(run.value),
                    **_effect(effect),
                    **self._details(run),
                }
            )
        record = {
            "model": self.model,
            "readout": self.readout,
            "metric": self.metric,
            "units": "prompts" if self.readout == "needle" else "windows",
            "n": len(self.baseline.units),
            "baseline": _number(self.baseline.value),
            "baseline_details": self._details(self.baseline),
            "seconds": {run.label: _number(run.seconds) for run in self.all_runs if run.seconds is not None},
            "runs": runs,
            "controls": controls,
            "control_of": self.control_of,
            "versus_controls": _numbers(self.versus_controls()),
            "settings": self.settings,
            "statistics": "delta = mean over units of (run - baseline); 95% t interval over units; two-sided "
            "sign-flip p (SPEC §12, paired over windows or prompts)",
        }
        if self.readout == "needle":
            record["retrieval_heads"] = [list(h) for h in self.retrieval_heads()]
        if self.readout != "needle" and "sink" in self.baseline.head_scores:
            record["sink_heads"] = [list(h) for h in top_heads(self.baseline.head_scores["sink"], 10)]
        return record

    def unit_records(self) -> list[dict]:
        """One record per window or prompt: its value in every run (keyed by label), exact match per run (needle)."""
        out = []
        for i in range(len(self.baseline.units)):
            base = dict(self.records[i]) if self.records is not None else {"window": i}
            base["values"] = {run.label: float(run.units[i]) for run in self.all_runs}
            if self.readout == "needle":
                base["exact"] = {run.label: bool(run.exact[i]) for run in self.all_runs}
            out.append(base)
        return out

    ARRAYS = {  # ablate.npz (formats.arrays): one row per run (baseline, the edits, the controls)
        "units": ("run", "unit"),
        "position_loss": optional("run", "position"),  # context
        "exact": optional("run", "unit"),  # needle
        "retrieval_score": optional("run", "unit", "layer", "head"),
        "mean_log_prob": optional("run", "length", "depth"),
        "accuracy": optional("run", "length", "depth"),
        "baseline_first_token_mass": optional("layer", "head"),  # where the baseline read it
    }

    def arrays(self) -> dict[str, np.ndarray]:
        arrays = {"units": np.stack([r.units for r in self.all_runs])}
        if self.readout == "context":
            arrays["position_loss"] = np.stack([r.position_loss for r in self.all_runs])
        if self.readout == "needle":
            arrays["exact"] = np.stack([r.exact for r in self.all_runs])
            arrays["retrieval_score"] = np.stack([r.retrieval for r in self.all_runs])
            arrays["mean_log_prob"] = np.stack([r.grid[0] for r in self.all_runs])
            arrays["accuracy"] = np.stack([r.grid[1] for r in self.all_runs])
        if self.baseline.first_token_mass is not None:
            arrays["baseline_first_token_mass"] = self.baseline.first_token_mass
        return arrays

    def metadata(self) -> dict:
        return {
            "model": self.model,
            "readout": self.readout,
            "metric": self.metric,
            "settings": self.settings,
            "labels": [r.label for r in self.all_runs],
            "edits": [list(r.edits) for r in self.all_runs],
        }

    def jsonl(self) -> str:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.unit_records())

    def table(self) -> str:
        """The runs as plain text: value, delta [95% interval], p."""
        unit = "prompts" if self.readout == "needle" else "windows"
        lines = [
            f"{self.readout}: {self.metric}, paired over {len(self.baseline.units)} {unit}",
            f"{'run':<44}{'value':>10}{'delta':>10}{'95% interval':>22}{'p':>8}  extra",
            f"{'baseline':<44}{self.baseline.value:>10.4f}{'':>40}  {_extra(self._details(self.baseline))}",
        ]
        for run in [*self.runs, *self.controls]:
            e = self.effect(run)
            ci = "—" if e["interval"] is None else f"[{e['interval'][0]:+.4f}, {e['interval'][1]:+.4f}]"
            label = run.label if len(run.label) <= 43 else run.label[:40] + "..."
            lines.append(
                f"{label:<44}{run.value:>10.4f}{e['delta']:>+10.4f}{ci:>22}{e['p']:>8.3f}  {_extra(self._details(run))}"
            )
        versus = self.versus_controls()
        if versus is not None:
            paired = versus["paired"]
            lines.append(
                f"target {versus['target']}: delta {versus['target_delta']:+.4f}; {len(self.controls)} controls "
                f"{versus['control_range'][0]:+.4f} .. {versus['control_range'][1]:+.4f} (mean "
                f"{versus['control_mean']:+.4f}); as extreme: {versus['share_as_extreme']:.3f}; target - controls' "
                f"mean {paired['delta']:+.4f}, p {paired['p']:.3g}"
            )
        return "\n".join(lines)

    def output_files(self, fmt: str) -> list[OutputFile]:
        """ablate.npz, prompts.jsonl (needle) or windows.jsonl, ablate.txt, ablate.json and the figures."""
        files = [
            arrays_file("ablate.npz", self),
            text_file("prompts.jsonl" if self.readout == "needle" else "windows.jsonl", self.jsonl, "jsonl"),
            text_file("ablate.txt", lambda: self.table() + "\n", "text"),
            text_file("ablate.json", lambda: json.dumps(self.to_dict(), indent=2) + "\n", "json"),
            figure_file(f"ablate_effects.{fmt}", self.plot_effects),
        ]
        if self.readout == "context":
            files.append(figure_file(f"ablate_loss.{fmt}", self.plot_loss))
        if self.readout == "needle":
            files.append(figure_file(f"ablate_grid.{fmt}", self.plot_grid))
        return files

    def plot_effects(self):
        from posprobe.plotting.ablate import effects_figure

        return effects_figure(self)

    def plot_loss(self):
        from posprobe.plotting.ablate import loss_figure

        return loss_figure(self)

    def plot_grid(self):
        from posprobe.plotting.ablate import grid_figure

        return grid_figure(self)


def _effect(effect: dict) -> dict:
    return {
        "delta": _number(effect["delta"]),
        "interval": effect["interval"],
        "stderr": _number(effect["stderr"]),
        "p": _number(effect["p"]),
        "p_exact": effect["p_exact"],
    }


def _extra(details: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in details.items() if v is not None)


def _number(value) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _numbers(value):
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, float):
        return _number(value)
    return value
