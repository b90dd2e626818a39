"""The run loop of a causal language model over steps: `run(model, steps, reducers, taps, edits=)` runs one forward
pass per `Step` (a batch of token windows for `posprobe context`, a prompt for `posprobe needle`), with `taps` (on
the attention kernel, `posprobe.kernel`) and the user's `edits` (SPEC §20, `posprobe.edits`: taps and hooks; with
`=mean` edits, a first pass over the same steps collects the means) applied, and hands each `StepOutput` to every
reducer (`add_output`).

A reducer says what it `needs`: "logits" (the output's logits), "loss" (the per-token losses, (B, m-1) float64,
`analysis.context_loss.token_nll`; where no reducer needs logits or rows, made block by block of positions,
`capture.logit_blocks`, so that no batch's B x m x V logits need fit in memory at once) or "rows" (the attention
query `step.row` gives each span of `step.spans`, per layer and head, (B, L, H) float64, `capture.retrieval`). Under
torchrun (SPEC §19) step k is rank k % world's alone (`start` numbers a run's steps after those of earlier runs of
the same command) and the reducers are merged over the ranks once, at the end (`runtime.distributed.merge_reducers`:
their `rank_sums`, then `merge_ranks()`).

Routes: with no taps and no rows the model runs with the attention it has (numbers as a plain forward pass; edits
that act by hooks alone, shift, rope-keep and channel, keep it). Rows run on the kernel's sdpa route (or the model's
own eager softmax rows where its family is outside AttentionInterface, `capture.retrieval.RetrievalRun`); taps on
the kernel's sdpa route too, and are refused in one line for a family outside AttentionInterface. The model's
attention implementation and train/eval mode are restored afterwards.

Dimensions: B rows of a step, m its tokens, L layers, H query heads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from posprobe.errors import PosprobeError
from posprobe.kernel import Taps

NEEDS = ("logits", "loss", "rows")


@dataclass(frozen=True)
class Step:
    """One forward pass: `input_ids` (B, m) (torch or numpy ints), the query `row` and per batch row the key
    `spans` [start, end) whose attention is read (None: none), extra forward keywords `kwargs` (e.g.
    `logits_to_keep`), and `meta`, the caller's own (a window start, a prompt)."""

    input_ids: Any
    row: int | None = None
    spans: list[tuple[int, int]] | None = None
    kwargs: dict = field(default_factory=dict)
    meta: Any = None


@dataclass(frozen=True)
class StepOutput:
    """What one step gave: its `index` (among every rank's steps), the `step`, the `input_ids` tensor on the model's
    device, the model `output` (its `.logits`), `loss` (B, m-1) float64 numpy where a reducer needs it, `rows`
    (B, L, H) float64 where the step reads rows, the `model` (a reducer may run it again: needle's greedy
    continuation) and the run's `taps` (its edits' and the caller's; None: none), for such a rerun."""

    index: int
    step: Step
    input_ids: Any
    output: Any
    model: Any
    loss: Any = None
    rows: Any = None
    taps: Taps | None = None

    @property
    def logits(self):
        return self.output.logits


class StepReducer(Protocol):
    needs: Collection[str]

    def add_output(self, out: StepOutput) -> None: ...


def run(
    model,
    steps: Iterable[Step],
    reducers: Sequence[StepReducer],
    taps: Taps | None = None,
    *,
    edits: Sequence = (),
    start: int = 0,
    total: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    shape: tuple[int, int] | None = None,
) -> int:
    """Run `model` once per step and hand each `StepOutput` to `reducers`; returns the number of steps numbered
    (every rank's), so that a following run of the same command can `start` after them. `progress(done, total)`
    after each of this rank's steps (every rank's steps counted). `shape`: (L, H) of the rows read (default: the
    model's, `capture.model.check_model`). Reducers are merged over torchrun ranks at the end. `edits`: parsed
    edits (`posprobe.edits.parse_edits`, checked by the caller against the config), applied in every pass; where one
    asks for a mean, this rank's steps are run once more before, without edits, to collect it (SPEC §20)."""
    import torch

    from posprobe.analysis.context_loss import token_nll
    from posprobe.capture.logit_blocks import window_loss
    from posprobe.capture.model import model_device
    from posprobe.capture.run import needs_of
    from posprobe.runtime import distributed

    needs = needs_of(reducers, NEEDS, "a step reducer")
    device = model_device(model)
    parallel = distributed.join_process_group(device)
    if parallel:
        distributed.check_mergeable(reducers)
    blocked = "loss" in needs and not {"logits", "rows"} & set(needs)
    index = start - 1
    applied = contextlib.nullcontext()
    if edits:
        from posprobe.edits.apply import EditRun
        from posprobe.edits.spec import needs_means

        means = None
        if needs_means(edits):
            steps = list(steps)
            means = _means(model, steps, edits, device, parallel, start)
        applied = EditRun(model, edits, means)
        taps = applied.taps.joined(taps) if applied.taps is not None else taps
    with applied, _Route(model, "rows" in needs, taps, shape) as route, torch.inference_mode():
        for index, step in enumerate(steps, start=start):
            if parallel and not distributed.mine(index):  # another rank's step (SPEC §19)
                continue
            ids = torch.as_tensor(step.input_ids, device=device)
            if blocked:  # losses alone: logits made and reduced block by block of positions where they would not fit
                output, rows, loss = None, None, window_loss(model, ids, device, call=route.call)
            else:
                output, rows = route.forward(ids, step)
                loss = token_nll(output.logits, ids) if "loss" in needs else None
            out = StepOutput(index, step, ids, output, model, loss, rows, taps)
            for reducer in reducers:
                reducer.add_output(out)
            del output, out
            if progress is not None and total is not None:
                progress(distributed.done_by_all(index, total), total)
    if parallel:  # once, after the last step: every rank then holds the sums of all steps
        distributed.merge_reducers(reducers)
    return index + 1


def _means(model, steps: Sequence[Step], edits, device, parallel: bool, start: int) -> dict:
    """The means `=mean` edits set (`edits.apply.MeanPass`): this rank's steps run once without edits, the sums
    over their tokens added over the ranks (only the last position's logits made where the model allows)."""
    import torch

    from posprobe.edits.apply import MeanPass
    from posprobe.runtime import distributed

    keep = _takes(model, "logits_to_keep")
    with MeanPass(model, edits) as collect, _Route(model, False, collect.taps, None) as route, torch.inference_mode():
        for index, step in enumerate(steps, start=start):
            if parallel and not distributed.mine(index):
                continue
            ids = torch.as_tensor(step.input_ids, device=device)
            kwargs = {**step.kwargs, **({"logits_to_keep": 1} if keep else {})}
            route.call(input_ids=ids, **kwargs)
    return collect.means(parallel)


def _takes(model, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


class _Route:
    """The attention a run's forward passes go through (see the module docstring), set on entry, restored on
    exit with the model's train/eval mode."""

    def __init__(self, model, rows: bool, taps: Taps | None, shape: tuple[int, int] | None):
        from posprobe.capture.eager import is_eager_route

        self.model, self.rows, self.taps = model, rows, taps
        self.eager = is_eager_route(model)
        if taps is not None and self.eager:
            kind = getattr(model.config, "model_type", "unknown")
            raise PosprobeError(
                f"'{kind}' computes attention in its own code, outside transformers' AttentionInterface, so posprobe "
                "cannot edit it",
                "use a family whose attention goes through AttentionInterface (Llama, Qwen, Gemma, GPT-2, ...)",
            )
        if rows and shape is None:
            from posprobe.capture.model import check_model

            shape = check_model(model)
        self.shape = shape
        self.retrieval = None
        self.previous = getattr(model.config, "_attn_implementation", None)

    def __enter__(self) -> _Route:
        from posprobe.capture.retrieval import RetrievalRun, retrieval_route
        from posprobe.kernel import register

        self.was_training = self.model.training
        self.model.eval()
        try:
            if self.rows:
                self.retrieval = RetrievalRun(self.model, *self.shape).__enter__()
            elif self.taps is not None:
                register()
                self.model.set_attn_implementation(retrieval_route(self.model))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.retrieval is not None:
            self.retrieval.__exit__()
        elif self.previous is not None and self.previous != getattr(self.model.config, "_attn_implementation", None):
            self.model.set_attn_implementation(self.previous)
        self.model.train(self.was_training)

    def call(self, **inputs):
        """The model's forward pass on `inputs` with this run's taps (no rows read)."""
        if self.taps is not None:
            return self.taps.forward(self.model, **inputs)
        return self.model(**inputs)

    def forward(self, ids, step: Step):
        """(model output, (B, L, H) rows or None) of one step."""
        if self.retrieval is not None:
            return self.retrieval.forward(ids, step.row, step.spans, taps=self.taps, **step.kwargs)
        if self.taps is not None:
            return self.taps.forward(self.model, input_ids=ids, **step.kwargs), None
        return self.model(input_ids=ids, **step.kwargs), None
