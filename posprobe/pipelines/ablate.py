"""`posprobe ablate` (issue 46): a study of edits with its controls. The baseline and each edit run on the same
windows (readouts `context`, `attention`) or prompts (`needle`); each run gives one value per window or prompt, and
its effect is the paired difference to the baseline's (`posprobe.analysis.ablate`).

- `context`: per window, the mean loss (nats) over the tokens at positions >= `from_position`; the run's value is
  their mean (its perplexity exp(value)), and its loss by position is kept for the figure;
- `attention`: per window, the first-token mass (SPEC §14: mean attention of queries i >= 1 on key 0) averaged over
  every layer and head, read on the kernel's pattern site after the edits;
- `needle`: per prompt, the answer's log-probability (with exact match and Wu et al.'s retrieval score beside it),
  from `pipelines.needle.needle` with the run's edits.

An edit is a string of SPEC §20 (`posprobe.edits`), several joined with '+' into one run. Heads can be named by a
measurement of the baseline: `head:retrieval:K` (the top K by Wu's retrieval score; readout needle) and
`head:sink:K` (the top K by first-token mass; readouts context and attention). Controls (`control` K, `seeds` N):
the first run whose edit acts on heads (or rotary bands) again on K random heads (pairs) distinct from its targets,
one draw per seed. Everything is checked before any weight is read; the model is loaded once.

Dimensions: R runs (baseline first), n windows or prompts, m window length, L layers, H heads.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from os import PathLike
from typing import Any

import numpy as np

from posprobe.errors import ArgumentValueError
from posprobe.pipelines.ablate_result import AblateResult, Run
from posprobe.validation import as_int

READOUTS = ("context", "needle", "attention")
METRICS = {
    "context": "mean loss (nats)",
    "needle": "mean answer log-probability (nats)",
    "attention": "first-token mass",
}
SELECTIONS = {"retrieval": ("needle",), "sink": ("context", "attention")}
_SELECT = re.compile(r"head:([a-z]+):(\d+)(=\w+)?")


def split_runs(edits: Sequence[str] | str) -> list[list[str]]:
    """The runs of `--edit` values: each value one run, its parts joined by '+' (e.g. 'attend:4,60+shift:10')."""
    if isinstance(edits, str):
        edits = [edits]
    if not isinstance(edits, Iterable) or not list(edits):
        raise ArgumentValueError("edit", "ablate needs at least one {arg}", "e.g. --edit head:retrieval:10")
    runs = []
    for text in edits:
        if not isinstance(text, str) or not text.strip():
            raise ArgumentValueError("edit", f"{{arg}} {text!r} is empty", "e.g. --edit attend:4,60")
        parts = [p.strip() for p in re.split(r"\+(?=\s*[a-z])", text.strip())]
        if any(not p for p in parts):
            raise ArgumentValueError(
                "edit", f"{{arg}} '{text}' has an empty part around '+'", "join edits as KIND:ARGS+KIND:ARGS"
            )
        runs.append(parts)
    return runs


def check_runs(runs: list[list[str]], readout: str, config: dict, name: str, longest: int | None) -> None:
    """Refuse, in one line, a run that cannot apply: the edit checks of SPEC §20 (selections left aside), a selection
    this readout does not measure."""
    from posprobe.edits import prepare_edits

    for parts in runs:
        fixed = []
        for part in parts:
            named = _SELECT.fullmatch(part)
            if named is None:
                fixed.append(part)
                continue
            kind = named.group(1)
            if kind not in SELECTIONS:
                raise ArgumentValueError(
                    "edit",
                    f"{{arg}} '{part}': no head selection '{kind}'",
                    "use head:retrieval:K (readout needle) or head:sink:K",
                )
            if readout not in SELECTIONS[kind]:
                raise ArgumentValueError(
                    "edit",
                    f"{{arg}} '{part}' ranks heads by a measure --readout {readout} does not make",
                    f"use it with --readout {' or '.join(SELECTIONS[kind])}",
                )
            as_int(int(named.group(2)), "edit", minimum=1)
            fixed.append(f"head:0.0{named.group(3) or ''}")  # its kind and value are checked like any head edit
        prepare_edits(fixed, config, name, longest)


def check_options(
    edits,
    source,
    *,
    readout: str = "context",
    control=None,
    seeds: int = 5,
    length: int = 512,
    windows: int = 8,
    from_position: int = 0,
    **_,
) -> None:
    """The checks `ablate` makes before any weight is read (for a CLI that writes nothing until they pass): the
    options, and every run's edits against the resolved checkpoint `source`'s config."""
    runs, length, *_ = _checked(edits, readout, control, seeds, length, windows, from_position)
    check_runs(runs, readout, source.config, source.label, None if readout == "needle" else length)


def _checked(edits, readout, control, seeds, length, windows, from_position):
    """(runs, length, windows, from_position, seeds, control) checked, one line for anything out of bounds."""
    if readout not in READOUTS:
        raise ArgumentValueError(
            "readout", f"{{arg}} '{readout}' is not one of {', '.join(READOUTS)}", "e.g. --readout needle"
        )
    runs = split_runs(edits)
    length = as_int(length, "length", minimum=8)
    windows = as_int(windows, "windows", minimum=2, hint="pairs need at least 2 windows, e.g. {arg} 8")
    from_position = as_int(from_position, "from_position", minimum=0, maximum=length - 2)
    seeds = as_int(seeds, "seeds", minimum=1, maximum=1000)
    if control is not None:
        control = as_int(control, "control", minimum=1)
        if not any(_acts_on(parts) for parts in runs):
            raise ArgumentValueError(
                "control",
                "{arg} needs an edit that acts on heads or rotary bands",
                "e.g. --edit head:retrieval:10 --control random:10",
            )
    return runs, length, windows, from_position, seeds, control


def ablate(
    model: str | PathLike | Any = "SmolLM2-135M-Instruct",
    edits: Sequence[str] | str = (),
    *,
    readout: str = "context",
    control: int | None = None,
    seeds: int = 5,
    tokenizer: Any = None,
    texts: Iterable[str] | str | None = "builtin:kjv",
    length: int = 512,
    windows: int = 8,
    from_position: int = 0,
    haystack: Any = "builtin:kjv",
    grid: Any = None,
    task: Any = None,
    device: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    allow_pickle: bool = False,
    source: Any = None,
) -> AblateResult:
    """Run the baseline, each edit of `edits` and the controls with readout `readout` (see the module docstring).

    model: a packaged name, folder, .gguf file or a loaded causal LM (then pass its `tokenizer`). context and
    attention: `texts` (a file or builtin name, or an iterable of texts) cut into `windows` windows of `length`
    tokens (a BOS first where the tokenizer adds one); context scores positions >= `from_position`. needle:
    `haystack`, `grid` (`NeedleGrid`) and `task` (`NeedleTask`). control: K random heads (or bands) per control
    run, `seeds` runs. progress(done, total) after each run."""
    from torch import nn

    runs, length, windows, from_position, seeds, control = _checked(
        edits, readout, control, seeds, length, windows, from_position
    )
    net = model if isinstance(model, nn.Module) else None
    if net is None:
        from posprobe.checkpoint import resolve_model

        source = source or resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=True)
        config, name = source.config, source.label
    else:
        if tokenizer is None:
            raise ArgumentValueError("tokenizer", "a model object carries no tokenizer", "pass {arg}=its tokenizer")
        config, name = net.config.to_dict(), str(getattr(net.config, "_name_or_path", "") or "model")
    check_runs(runs, readout, config, name, None if readout == "needle" else length)
    if readout == "needle":
        from posprobe.pipelines.needle import NeedleGrid
        from posprobe.pipelines.needle_prompts import NeedleTask

        grid = NeedleGrid(lengths=(256, 512), depths=(0.0, 0.5, 1.0), trials=2) if grid is None else grid
        task = NeedleTask() if task is None else task
    if tokenizer is None:
        from posprobe.checkpoint.loading import load_tokenizer

        tokenizer = load_tokenizer(source.path, "use a model folder or .gguf file that holds its tokenizer")
    windows_ids = None
    if readout != "needle":
        windows_ids = _windows(texts, tokenizer, length, windows)
    if net is None:
        from posprobe.capture.model import place_on, resolve_device
        from posprobe.pipelines.needle import _load_causal_lm

        net = place_on(_load_causal_lm(source, {}), resolve_device(device))
    from posprobe.capture.model import check_model

    n_layers, n_heads = check_model(net)
    sinks = any(p.startswith("head:sink:") for parts in runs for p in parts)
    reader = _Reader(readout, net, tokenizer, windows_ids, from_position, haystack, grid, task, sinks)
    total = 1 + len(runs) + (seeds if control is not None else 0)
    done = [0]

    def measured(parts: list[str], heads, label: str) -> Run:
        start = time.perf_counter()
        run = reader.run(parts, heads, label)
        run = replace(run, seconds=time.perf_counter() - start)
        done[0] += 1
        if progress is not None:
            progress(done[0], total)
        return run

    baseline = measured([], [], "baseline")
    results, target = [], None
    for parts in runs:
        resolved = [_resolve(part, baseline, n_layers, n_heads) for part in parts]
        heads = _heads_of(resolved, n_layers, n_heads)
        run = measured(resolved, heads, "+".join(parts))
        results.append(run)
        if target is None and _acts_on(resolved):
            target = run
    controls = []
    if control is not None:
        controls = _controls(target, control, seeds, n_layers, n_heads, config, name, measured)
    return AblateResult(
        model=name,
        readout=readout,
        metric=METRICS[readout],
        n_layers=n_layers,
        n_heads=n_heads,
        baseline=baseline,
        runs=results,
        controls=controls,
        control_of=None if target is None else target.label,
        settings=reader.settings(length, windows, control, seeds),
        records=reader.records(),
    )


def _acts_on(parts: Sequence[str]) -> bool:
    return any(p.startswith("head:") or p.startswith("band:") for p in parts)


def _resolve(part: str, baseline: Run, n_layers: int, n_heads: int) -> str:
    """`part` with a head selection (`head:retrieval:K`, `head:sink:K`) replaced by the heads it names."""
    from posprobe.analysis.ablate import top_heads

    named = _SELECT.fullmatch(part)
    if named is None:
        return part
    scores = baseline.head_scores[named.group(1)]
    heads = top_heads(scores, int(named.group(2)))
    return "head:" + ",".join(f"{layer}.{head}" for layer, head in heads) + (named.group(3) or "")


def _heads_of(parts: Sequence[str], n_layers: int, n_heads: int) -> list[list[int]]:
    """[[layer, head], ...] of the head edits among `parts` ('*' expanded), in the order written."""
    from posprobe.edits import HeadEdit, parse_edit

    heads = []
    for part in parts:
        edit = parse_edit(part)
        if not isinstance(edit, HeadEdit):
            continue
        for layer, head in edit.heads:
            for a in range(n_layers) if layer is None else [layer]:
                for b in range(n_heads) if head is None else [head]:
                    if [a, b] not in heads:
                        heads.append([a, b])
    return heads


def _bands_of(parts: Sequence[str]) -> tuple[list[int], str]:
    """(the rotary pairs of the band edits among `parts`, their layer selection as written: '*' or a number)."""
    from posprobe.edits import BandEdit, parse_edit

    pairs, layers = [], "*"
    for part in parts:
        edit = parse_edit(part)
        if isinstance(edit, BandEdit):
            for layer, pair in edit.pairs:
                layers = "*" if layer is None else str(layer)
                if pair not in pairs:
                    pairs.append(pair)
    return pairs, layers


def _controls(target: Run, k: int, seeds: int, n_layers: int, n_heads: int, config, name, measured) -> list[Run]:
    """The control runs: the target's edit on `k` random heads (or rotary pairs) distinct from its own, per seed."""
    from posprobe.analysis.ablate import random_bands, random_heads
    from posprobe.edits import edit_model

    parts = target.edits
    out = []
    if target.heads:
        value = next((p.split("=", 1)[1] for p in parts if p.startswith("head:") and "=" in p), None)
        suffix = f"={value}" if value else ""
        for seed in range(seeds):
            heads = random_heads(n_layers, n_heads, k, [tuple(h) for h in target.heads], seed)
            edit = "head:" + ",".join(f"{a}.{b}" for a, b in heads) + suffix
            run = measured([edit], [list(h) for h in heads], f"control seed {seed}")
            out.append(run.with_seed(seed))
        return out
    pairs, layers = _bands_of(parts)
    total = edit_model(config, name).pairs
    for seed in range(seeds):
        bands = random_bands(total, k, pairs, seed)
        run = measured([f"band:{layers}.{f}" for f in bands], [], f"control seed {seed}")
        out.append(run.with_seed(seed, bands=bands))
    return out


def _windows(texts, tokenizer, length: int, count: int) -> list[list[int]]:
    """`count` windows of `length` tokens cut from the texts joined with EOS (a BOS first where the tokenizer adds
    one), refused in one line where the texts are too short."""
    from posprobe.pipelines.context import bos_of, token_stream
    from posprobe.pipelines.needle import _haystack_texts

    _, documents = _haystack_texts(texts)
    bos = bos_of(tokenizer)
    body = length - (bos is not None)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    stream, _ = token_stream(documents, body * count, encode, getattr(tokenizer, "eos_token_id", None))
    if len(stream) < body * count:
        raise ArgumentValueError(
            "windows",
            f"the texts hold {len(stream)} tokens, too few for {count} windows of {length}",
            "pass longer texts, or fewer --windows or a shorter --length",
        )
    return [([bos] if bos is not None else []) + list(stream[i * body : (i + 1) * body]) for i in range(count)]


class _FirstTokenMass:
    """Taps on the kernel's pattern site that sum, per window, the attention of queries i >= 1 on key 0 per layer
    and head (SPEC §14's first-token mass; every query sees key 0 in a causal window without edits)."""

    def __init__(self, n_layers: int, n_heads: int):
        self.n_layers, self.n_heads = n_layers, n_heads
        self.sums: dict[int, Any] = {}
        self.count = 0

    def taps(self):
        from posprobe.kernel import Taps

        return Taps().on("pattern", self.add)

    def add(self, probs, call) -> None:  # probs (B, H, q, keys)
        if call.repeated:
            return
        start = 0 if call.rows is None else call.rows[0]
        first = probs[..., 0].double().cpu()  # (B, H, q)
        skip = max(0, 1 - start)
        part = first[..., skip:].sum(-1)  # (B, H)
        self.sums[call.index] = self.sums.get(call.index, 0) + part
        if call.index == 0:
            self.count += first.shape[-1] - skip

    def take(self) -> np.ndarray:
        """(B, L, H): the mean over queries i >= 1 of the attention on key 0, then starts over."""
        import torch

        layers = [self.sums[k] for k in sorted(self.sums)]
        out = torch.full((layers[0].shape[0], self.n_layers, self.n_heads), float("nan"), dtype=torch.float64)
        for i, sums in enumerate(layers):
            out[:, i, : sums.shape[1]] = sums / max(1, self.count)
        self.sums, self.count = {}, 0
        return out.numpy()


class _Windows:
    """The step reducer of one context or attention run: each window's losses (m - 1,) and, with `mass`, its
    first-token mass (L, H)."""

    needs = ("loss",)

    def __init__(self, mass: _FirstTokenMass | None):
        self.mass, self.loss, self.first = mass, [], []

    def add_output(self, out) -> None:
        self.loss.append(np.asarray(out.loss, dtype=np.float64)[0])
        if self.mass is not None:
            self.first.append(self.mass.take()[0])


class _Reader:
    """One readout over the same windows or prompts, run with any edits (`run`)."""

    def __init__(self, readout, net, tokenizer, windows_ids, from_position, haystack, grid, task, sinks=False):
        self.readout, self.net, self.tokenizer, self.sinks = readout, net, tokenizer, sinks
        self.windows, self.from_position = windows_ids, from_position
        self.haystack, self.grid, self.task = haystack, grid, task
        self.prompts = None

    def settings(self, length: int, windows: int, control, seeds: int) -> dict:
        common = {
            "control": None if control is None else f"random:{control}",
            "seeds": seeds if control is not None else 0,
        }
        if self.readout == "needle":
            return common | {
                "lengths": list(self.grid.lengths),
                "depths": list(self.grid.depths),
                "trials": self.grid.trials,
                "seed": self.grid.seed,
                "haystack": str(self.haystack),
            }
        return common | {"length": length, "windows": windows, "from_position": self.from_position}

    def records(self) -> list[dict] | None:
        """needle: each prompt's grid cell, answer and spans (the keys of prompts.jsonl before the runs' values)."""
        if self.prompts is None:
            return None
        keys = ("length", "depth", "trial", "answer", "achieved_length", "achieved_depth", "needle_span")
        return [{k: record[k] for k in keys} for record in self.prompts]

    def run(self, parts: list[str], heads, label: str) -> Run:
        if self.readout == "needle":
            return self._needle(parts, heads, label)
        return self._windows(parts, heads, label)

    def _needle(self, parts, heads, label) -> Run:
        from posprobe.pipelines.needle import needle

        result = needle(
            self.net,
            tokenizer=self.tokenizer,
            haystack=self.haystack,
            grid=self.grid,
            task=self.task,
            edits=list(parts) or None,
        )
        if self.prompts is None:
            self.prompts = result.records
        flat = result.log_prob.reshape(-1)
        retrieval = result.retrieval_score.reshape(-1, *result.retrieval_score.shape[-2:])
        return Run(
            label=label,
            edits=list(parts),
            heads=heads,
            units=flat,
            exact=result.exact.reshape(-1).astype(np.float64),
            retrieval=retrieval,
            head_scores={"retrieval": result.head_retrieval, "attending": result.head_attention},
            grid=(result.mean_log_prob, result.accuracy),
        )

    def _windows(self, parts, heads, label) -> Run:
        from posprobe.capture.loop import Step, run
        from posprobe.capture.model import check_model
        from posprobe.edits import parse_edits

        wanted = self.readout == "attention" or (self.sinks and not parts)  # head:sink:K ranks the baseline's
        mass = _FirstTokenMass(*check_model(self.net)) if wanted else None
        reducer = _Windows(mass)
        steps = (Step([w], kwargs={"use_cache": False}, meta=i) for i, w in enumerate(self.windows))
        run(self.net, steps, [reducer], None if mass is None else mass.taps(), edits=parse_edits(parts))
        loss = np.stack(reducer.loss)  # (n, m - 1): loss[:, t] predicts the token at position t + 1
        scored = loss[:, max(0, self.from_position - 1) :]
        first = np.stack(reducer.first) if reducer.first else None  # (n, L, H)
        if self.readout == "attention":
            units = np.nanmean(first.reshape(len(first), -1), axis=1)
        else:
            units = scored.mean(1)
        scores = {} if first is None else {"sink": np.nanmean(first, axis=0)}
        return Run(
            label=label,
            edits=list(parts),
            heads=heads,
            units=units,
            position_loss=loss.mean(0),
            head_scores=scores,
            first_token_mass=None if first is None else np.nanmean(first, axis=0),
        )
