"""The result of `posprobe needle` (SPEC §18): `NeedleResult`, its .npz arrays, prompts.jsonl records, JSON record,
text table and figures.

Dimensions: Lg lengths, D depths, T trials, L layers, H query heads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from posprobe.analysis.needle import cell_means, head_means, position_gaps, ranked_heads, top_overlap
from posprobe.formats.arrays import optional
from posprobe.formats.save import OutputFile, Saves, arrays_file, figure_file, text_file
from posprobe.results import ResultMixin

TOP_HEADS = 10


@dataclass(frozen=True, repr=False)
class NeedleResult(ResultMixin, Saves):
    """Scores of every prompt of the grid: `log_prob` (Lg, D, T) the answer's teacher-forced log-probability
    (nats, float64); `exact` (Lg, D, T) greedy exact match; `needle_attention` (Lg, D, T, L, H) the attention the
    last prompt token gives the needle's tokens; `achieved_length` / `achieved_depth` / `needle_tokens` (Lg, D, T)
    as measured in tokens; `uniform_share` (Lg, D, T) needle tokens / prompt tokens, what a query attending
    uniformly would give the needle; `retrieval_score` (Lg, D, T, L, H) Wu et al. 2024's retrieval score (the share
    of the answer's decoding steps at which the head's most-attended key is a needle token equal to the token
    generated; NaN where not read). `records`: one dict per prompt (prompts.jsonl), in grid order.

    Two head rankings: "needle-attending heads" (`needle_attending_heads`, the attention the last prompt token
    gives the needle) and "retrieval heads" (`retrieval_heads`, Wu's score: heads that copy the answer from the
    needle while it is generated)."""

    model: str
    model_type: str
    haystack: str
    task: dict
    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    trials: int
    seed: int
    window: int | None
    n_layers: int
    n_heads: int
    route: str
    log_prob: np.ndarray
    exact: np.ndarray
    needle_attention: np.ndarray
    achieved_length: np.ndarray
    achieved_depth: np.ndarray
    needle_tokens: np.ndarray
    uniform_share: np.ndarray
    records: list
    quantization: str | None = None
    edits: list = field(default_factory=list)  # SPEC §20: the edits applied in every pass, as written
    retrieval_score: np.ndarray | None = None

    _repr_fields = ("model", "lengths", "depths", "trials", "accuracy", "mean_log_prob")
    ARRAYS = {  # needle.npz (formats.arrays)
        "log_prob": ("length", "depth", "trial"),
        "exact": ("length", "depth", "trial"),
        "needle_attention": ("length", "depth", "trial", "layer", "head"),
        "lengths": ("length",),
        "depths": ("depth",),
        "achieved_length": ("length", "depth", "trial"),
        "achieved_depth": ("length", "depth", "trial"),
        "needle_tokens": ("length", "depth", "trial"),
        "uniform_share": ("length", "depth", "trial"),
        "accuracy": ("length", "depth"),
        "mean_log_prob": ("length", "depth"),
        "retrieval_score": optional("length", "depth", "trial", "layer", "head"),  # Wu et al.'s (issue 46)
    }

    @classmethod
    def from_scores(cls, *, grid, task, prompts: Sequence, scores: Sequence, decode: Callable, **fields):
        """Arrange per-prompt `scores` (grid order, `NeedleGrid.cells`) into the grid's arrays."""
        shape = (len(grid.lengths), len(grid.depths), grid.trials)
        arrays = {name: np.full(shape, np.nan) for name in ("log_prob", "achieved_depth", "uniform_share")}
        exact = np.zeros(shape, dtype=bool)
        lengths, needles = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
        attention = np.full((*shape, fields["n_layers"], fields["n_heads"]), np.nan)
        retrieval = attention.copy()
        records = []
        for (i, j, t), prompt, score in zip(grid.cells(), prompts, scores):
            arrays["log_prob"][i, j, t] = score.log_prob
            arrays["achieved_depth"][i, j, t] = prompt.achieved_depth
            span = prompt.needle_span[1] - prompt.needle_span[0]
            arrays["uniform_share"][i, j, t] = span / prompt.achieved_length
            exact[i, j, t], lengths[i, j, t], needles[i, j, t] = score.exact, prompt.achieved_length, span
            attention[i, j, t] = score.needle_attention
            if score.retrieval is not None:
                retrieval[i, j, t] = score.retrieval
            greedy = {"greedy_ids": list(score.greedy_ids), "greedy": decode(score.greedy_ids)}
            scored = {"log_prob": score.log_prob, "answer_token_log_probs": list(score.token_log_probs)}
            copying = [[int(a), int(b), float(retrieval[i, j, t, a, b])]
                       for a, b in zip(*np.nonzero(np.nan_to_num(retrieval[i, j, t]) > 0))]  # fmt: skip
            records.append(prompt.record() | scored | {"exact": bool(score.exact)} | greedy
                           | {"retrieval_heads": copying})  # fmt: skip
        return cls(task=asdict(task), lengths=grid.lengths, depths=grid.depths, trials=grid.trials, seed=grid.seed,
                   exact=exact, needle_attention=attention, achieved_length=lengths, needle_tokens=needles,
                   records=records, retrieval_score=retrieval, **arrays, **fields)  # fmt: skip

    @classmethod
    def load(cls, folder) -> NeedleResult:
        """The result a `posprobe needle` run wrote into `folder` (needle.npz and prompts.jsonl), e.g. to redraw
        its figures."""
        from pathlib import Path

        from posprobe.formats.writing import load_npz

        metadata, arrays = load_npz(Path(folder) / "needle.npz")
        text = (Path(folder) / "prompts.jsonl").read_text(encoding="utf-8")
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        names = ("log_prob", "exact", "needle_attention", "achieved_length", "achieved_depth", "needle_tokens",
                 "uniform_share")  # fmt: skip
        kept = {k: metadata[k] for k in ("model", "model_type", "quantization", "haystack", "task", "trials", "seed",
                                         "window", "n_layers", "n_heads", "route")}  # fmt: skip
        return cls(lengths=tuple(metadata["lengths"]), depths=tuple(metadata["depths"]), records=records,
                   edits=list(metadata.get("edits") or []), retrieval_score=arrays.get("retrieval_score"),
                   **{k: arrays[k] for k in names}, **kept)  # fmt: skip

    @property
    def accuracy(self) -> np.ndarray:
        """(Lg, D): share of trials whose greedy continuation is exactly the answer."""
        return cell_means(self.exact.astype(np.float64))

    @property
    def mean_log_prob(self) -> np.ndarray:
        """(Lg, D): mean over trials of the answer's log-probability (nats)."""
        return cell_means(self.log_prob)

    def gaps(self, of: str = "accuracy") -> tuple[np.ndarray, np.ndarray]:
        """(primacy, recency) gaps (Lg,) of the depth curve of `of` ('accuracy' or 'log_prob')."""
        return position_gaps(self.accuracy if of == "accuracy" else self.mean_log_prob)

    @property
    def head_attention(self) -> np.ndarray:
        """(L, H): attention of the last prompt token on the needle, per head, mean over all prompts."""
        return head_means(self.needle_attention)

    @property
    def head_retrieval(self) -> np.ndarray:
        """(L, H): Wu et al. 2024's retrieval score of each head, mean over all prompts (NaN where not read)."""
        if self.retrieval_score is None:
            return np.full((self.n_layers, self.n_heads), np.nan)
        return head_means(self.retrieval_score)

    def retrieval_heads(self, top: int | None = TOP_HEADS) -> list[dict]:
        """The heads with the highest retrieval score (Wu et al. 2024), largest first."""
        return [
            {"layer": layer, "head": head, "retrieval_score": _number(value)}
            for layer, head, value in ranked_heads(self.head_retrieval, top)
        ]

    def top_heads(self, top: int | None = TOP_HEADS) -> list[dict]:
        """The needle-attending heads: those that attend most to the needle from the last prompt token, largest
        first, with the ratio to what uniform attention would give it (`needle_attending_heads`)."""
        return self.needle_attending_heads(top)

    def needle_attending_heads(self, top: int | None = TOP_HEADS) -> list[dict]:
        """The heads that attend most to the needle from the last prompt token, largest first, with the ratio to
        what uniform attention would give it."""
        uniform = float(np.nanmean(self.uniform_share))
        return [
            {
                "layer": layer,
                "head": head,
                "needle_attention": _number(value),
                "times_uniform": _number(value / uniform),
            }
            for layer, head, value in ranked_heads(self.head_attention, top)
        ]

    def arrays(self) -> dict[str, np.ndarray]:
        """The .npz arrays."""
        return {
            "log_prob": self.log_prob,
            "exact": self.exact,
            "needle_attention": self.needle_attention,
            "lengths": np.asarray(self.lengths),
            "depths": np.asarray(self.depths),
            "achieved_length": self.achieved_length,
            "achieved_depth": self.achieved_depth,
            "needle_tokens": self.needle_tokens,
            "uniform_share": self.uniform_share,
            "retrieval_score": self.retrieval_score
            if self.retrieval_score is not None
            else np.full(self.needle_attention.shape, np.nan),
            "accuracy": self.accuracy,
            "mean_log_prob": self.mean_log_prob,
        }

    def metadata(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "quantization": self.quantization,
            "haystack": self.haystack,
            "task": self.task,
            "lengths": list(self.lengths),
            "depths": list(self.depths),
            "trials": self.trials,
            "seed": self.seed,
            "window": self.window,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "route": self.route,
            "edits": list(self.edits),
            "prompt_format": (
                "the tokenizer's chat template: one user turn of intro, haystack with the needle at a sentence "
                "boundary and the question's sentences, the assistant's turn opened with the question's last words; "
                "the answer ' ' + answer follows"
                if (self.task or {}).get("chat")
                else "plain continuation, no chat template: [BOS if the tokenizer adds one] intro, haystack with the "
                "needle at a sentence boundary, question; the answer ' ' + answer follows"
            ),
        }

    def jsonl(self) -> str:
        """prompts.jsonl: one JSON record per prompt."""
        return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in self.records)

    def command_record(self, saved) -> dict:
        """`needle --json`: `to_dict()` with `files` (each file's name without its extension -> its path)."""
        return self.to_dict() | {"files": {name.split(".")[0]: str(path) for name, path in saved.paths.items()}}

    def to_dict(self) -> dict:
        acc_first, acc_last = self.gaps("accuracy")
        lp_first, lp_last = self.gaps("log_prob")
        per_length = []
        for i, length in enumerate(self.lengths):
            per_length.append(
                {
                    "length": length,
                    "accuracy": [_number(x) for x in self.accuracy[i]],
                    "mean_log_prob": [_number(x) for x in self.mean_log_prob[i]],
                    "achieved_depth": [_number(x) for x in cell_means(self.achieved_depth)[i]],
                    "primacy_gap_accuracy": _number(acc_first[i]),
                    "recency_gap_accuracy": _number(acc_last[i]),
                    "primacy_gap_log_prob": _number(lp_first[i]),
                    "recency_gap_log_prob": _number(lp_last[i]),
                }
            )
        return self.metadata() | {
            "n_prompts": len(self.records),
            "overall_accuracy": _number(self.exact.mean()),
            "grid": per_length,
            "needle_attending_heads": self.needle_attending_heads(),
            "retrieval_heads": self.retrieval_heads(),
            "retrieval_heads_above_0.1": int(np.sum(np.nan_to_num(self.head_retrieval) > 0.1)),
            "top_overlap": top_overlap(self.head_attention, self.head_retrieval, TOP_HEADS),
        }

    def table(self) -> str:
        """The grid as plain text: accuracy and mean log-probability per length (rows) and depth (columns) with the
        primacy and recency gaps, the measured depths, and the top heads."""
        head = f"{'length':>7}" + "".join(f"{d:>9.2f}" for d in self.depths) + f"{'primacy':>10}{'recency':>10}"
        lines = []
        for of, title, values, cell in (
            ("accuracy", "accuracy (greedy exact match) by length and depth", self.accuracy, "{:>9.0%}"),
            ("log_prob", "mean log p(answer), nats", self.mean_log_prob, "{:>9.2f}"),
        ):
            first, last = self.gaps(of)
            lines += [title, head]
            for i, length in enumerate(self.lengths):
                row = "".join(cell.format(v) if np.isfinite(v) else f"{'—':>9}" for v in values[i])
                gaps = "".join(f"{g:>+10.2f}" if np.isfinite(g) else f"{'—':>10}" for g in (first[i], last[i]))
                lines.append(f"{length:>7}{row}{gaps}")
        measured = cell_means(self.achieved_depth)
        lines.append("measured depth (mean over trials): " + "; ".join(
            f"{length}: " + " ".join(f"{d:.2f}" for d in measured[i]) for i, length in enumerate(self.lengths)
        ))  # fmt: skip
        heads = ", ".join(
            f"L{h['layer']}.H{h['head']} {h['needle_attention']:.2f} ({h['times_uniform']:.0f}x)"
            for h in self.top_heads(5)
        )
        lines.append(f"needle-attending heads (mean attention of the last prompt token on the needle): {heads}")
        wu = ", ".join(f"L{h['layer']}.H{h['head']} {h['retrieval_score']:.2f}" for h in self.retrieval_heads(5))
        if wu:
            lines.append(f"retrieval heads (Wu et al. 2024: share of answer steps copied from the needle): {wu}; "
                         f"{top_overlap(self.head_attention, self.head_retrieval, TOP_HEADS)} of the top "
                         f"{TOP_HEADS} in both rankings")  # fmt: skip
        return "\n".join(lines)

    def output_files(self, fmt: str) -> list[OutputFile]:
        """`needle.npz` (arrays and JSON metadata), `prompts.jsonl` (one line per prompt), `needle.txt` (the table),
        and the figures `needle_grid`, `needle_depth`, `needle_heads`."""
        return [
            arrays_file("needle.npz", self),
            text_file("prompts.jsonl", self.jsonl, "jsonl"),
            text_file("needle.txt", lambda: self.table() + "\n", "text"),
            figure_file(f"needle_grid.{fmt}", self.plot),
            figure_file(f"needle_depth.{fmt}", self.plot_depth),
            figure_file(f"needle_heads.{fmt}", self.plot_heads),
        ]

    def plot(self):
        """The length x depth heatmaps (accuracy, mean log-probability)."""
        from posprobe.plotting.needle import grid_figure

        return grid_figure(self)

    def plot_depth(self):
        """The depth curve of each length, with its primacy and recency gaps."""
        from posprobe.plotting.needle import depth_figure

        return depth_figure(self)

    def plot_heads(self):
        """Retrieval attention per layer and head, the top heads named."""
        from posprobe.plotting.needle import heads_figure

        return heads_figure(self)


def _number(value) -> float | None:
    """A float for JSON (None for NaN or infinity)."""
    value = float(value)
    return value if math.isfinite(value) else None
