"""The one run loop: every forward pass posprobe makes over text goes through `drive`.

`drive(net, items, reducers, make_route, taps=, edits=, start=)` runs one forward pass per item, with `taps` (on the
attention kernel, `posprobe.kernel`) and the user's `edits` (SPEC §20, `posprobe.edits`: taps and hooks; where one
asks for `=mean`, a first pass over the same items collects the means) applied. Under torchrun (SPEC §19) item k is
rank k % world's alone (`start` numbers a run's items after those of earlier runs of the same command) and the
reducers are merged over the ranks once, at the end (`runtime.distributed.merge_reducers`: their `rank_sums`, then
`merge_ranks()`). What one pass is, and what it hands the reducers, is its `Route`'s:

- `capture.run.BatchRoute`: padded text batches (`capture.capture_batches`: attention recorded as whole matrices, in
  blocks of query rows or on a family's eager path, hidden states): every text analysis;
- `StepRoute` (here, through `run(model, steps, reducers)`): `Step`s, windows of a long text for `posprobe context`
  and prompts for `posprobe needle`: logits, per-token losses, single attention rows.

A step reducer says what it `needs`: "logits" (the output's logits), "loss" (the per-token losses, (B, m-1)
float64, `analysis.context_loss.token_nll`; where no reducer needs logits or rows, made block by block of
positions, `capture.logit_blocks`, so that no batch's B x m x V logits need fit in memory at once) or "rows" (the
attention query `step.row` gives each span of `step.spans`, per layer and head, (B, L, H) float64,
`capture.retrieval`), and gets each `StepOutput` through `add_output`.

Step routes: with no taps and no rows the model runs with the attention it has (numbers as a plain forward pass;
edits that act by hooks alone, shift, rope-keep and channel, keep it). Rows run on the kernel's sdpa route (or the
model's own eager softmax rows where its family is outside AttentionInterface, `capture.retrieval.RetrievalRun`);
taps on the kernel's sdpa route too. Taps are refused in one line for a family outside AttentionInterface
(`refuse_taps`). Every route restores the model's attention implementation and train/eval mode on exit.

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


class Route(Protocol):
    """How a run's forward passes go (entered once around the loop). `step(index, item)`: run this rank's item and
    hand what it gave to the reducers; `other(index, item)`: another rank's item (bookkeeping only);
    `finish(parallel)`: after the last item, on every rank; whether there is anything to merge over the ranks."""

    def __enter__(self) -> Route: ...

    def __exit__(self, *exc) -> None: ...

    def step(self, index: int, item: Any) -> None: ...

    def other(self, index: int, item: Any) -> None: ...

    def finish(self, parallel: bool) -> bool: ...


#: make_route(taps, collect): the route of a run with these taps; with `collect` (an `edits.apply.MeanPass`), the
#: route of the first pass that collects `=mean` edits' means: plain forward passes, nothing handed to reducers
RouteMaker = Callable[..., Route]


def drive(
    net,
    items: Iterable[Any],
    reducers: Sequence[Any],
    make_route: RouteMaker,
    *,
    taps: Taps | None = None,
    edits: Sequence = (),
    start: int = 0,
) -> int:
    """Run `net` once per item of `items` on the route `make_route(taps)` and merge `reducers` over the torchrun
    ranks at the end; returns the number of items numbered (every rank's: `start` + their count), so that a
    following run of the same command can `start` after them. `edits`: parsed edits (`posprobe.edits.parse_edits`,
    checked by the caller against the config), applied in every pass (their taps before `taps`); where one asks
    for a mean, this rank's items are run once before, without edits, on `make_route(mean_taps, collect)`."""
    import torch

    from posprobe.capture.model import model_device
    from posprobe.runtime import distributed

    parallel = distributed.join_process_group(model_device(net))
    if parallel:
        distributed.check_mergeable(reducers)
    applied = contextlib.nullcontext()
    if edits:
        from posprobe.edits.apply import EditRun
        from posprobe.edits.spec import needs_means

        means = None
        if needs_means(edits):
            items = list(items)
            means = _means(net, items, edits, make_route, parallel, start)
        applied = EditRun(net, edits, means)
        taps = applied.taps.joined(taps) if applied.taps is not None else taps
    index = start - 1
    with applied, make_route(taps) as route, torch.inference_mode():
        for index, item in enumerate(items, start=start):
            if parallel and not distributed.mine(index):  # another rank's item (SPEC §19)
                route.other(index, item)
                continue
            route.step(index, item)
        merge = route.finish(parallel)
    if parallel and merge:  # once, after the last item: every rank then holds the sums of all items
        distributed.merge_reducers(reducers)
    return index + 1


def _means(net, items: Sequence[Any], edits, make_route: RouteMaker, parallel: bool, start: int) -> dict:
    """The means `=mean` edits set (`edits.apply.MeanPass`): this rank's items run once without edits, the sums
    over their real tokens added over the ranks."""
    import torch

    from posprobe.edits.apply import MeanPass
    from posprobe.runtime import distributed

    with MeanPass(net, edits) as collect, make_route(collect.taps, collect) as route, torch.inference_mode():
        for index, item in enumerate(items, start=start):
            if not parallel or distributed.mine(index):
                route.step(index, item)
    return collect.means(parallel)


def needs_of(reducers: Sequence[Any], allowed: Sequence[str], kind: str = "a reducer") -> set[str]:
    """What `reducers` need together; ValueError naming one that needs something outside `allowed`."""
    needs: set[str] = set()
    for reducer in reducers:
        unknown = set(reducer.needs) - set(allowed)
        if unknown:
            raise ValueError(f"{type(reducer).__name__} needs {sorted(unknown)}; {kind} may need {list(allowed)}")
        needs |= set(reducer.needs)
    return needs


def refuse_taps(model, taps: Taps | None) -> None:
    """PosprobeError in one line where `taps` would need the attention kernel and the model's family computes its
    attention outside transformers' AttentionInterface (`capture.eager.is_eager_route`)."""
    from posprobe.capture.eager import is_eager_route

    if taps is not None and is_eager_route(model):
        kind = getattr(model.config, "model_type", "unknown")
        raise PosprobeError(
            f"'{kind}' computes attention in its own code, outside transformers' AttentionInterface, so posprobe "
            "cannot edit it",
            "use a family whose attention goes through AttentionInterface (Llama, Qwen, Gemma, GPT-2, BERT, ...)",
        )


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
    """Run `model` once per step (`drive` on a `StepRoute`) and hand each `StepOutput` to `reducers`; returns the
    number of steps numbered (every rank's), so that a following run of the same command can `start` after them.
    `progress(done, total)` after each of this rank's steps (every rank's steps counted). `shape`: (L, H) of the
    rows read (default: the model's, `capture.model.check_model`). `edits` as `drive` takes them (the means pass
    makes only the last position's logits where the model allows)."""
    needs = needs_of(reducers, NEEDS, "a step reducer")

    def make_route(taps: Taps | None, collect=None) -> StepRoute:
        if collect is not None:
            return StepRoute(model, (), set(), taps, mean_pass=True)
        return StepRoute(model, reducers, needs, taps, shape=shape, progress=progress, total=total)

    return drive(model, steps, reducers, make_route, taps=taps, edits=edits, start=start)


class StepRoute:
    """The route of `Step`s (see the module docstring): set on entry, the model's attention implementation and
    train/eval mode restored on exit. `mean_pass`: the plain passes of an `=mean` edit's first pass (the last
    position's logits alone where the model takes `logits_to_keep`)."""

    def __init__(
        self,
        model,
        reducers: Sequence[StepReducer],
        needs: set[str],
        taps: Taps | None,
        *,
        shape: tuple[int, int] | None = None,
        progress: Callable[[int, int], None] | None = None,
        total: int | None = None,
        mean_pass: bool = False,
    ):
        from posprobe.capture.model import model_device

        refuse_taps(model, taps)
        self.model, self.reducers, self.taps = model, reducers, taps
        self.rows = "rows" in needs
        self.loss = "loss" in needs
        self.blocked = self.loss and not {"logits", "rows"} & needs  # losses alone: reduced in blocks of positions
        self.progress, self.total = progress, total
        self.keep_last = mean_pass and _takes(model, "logits_to_keep")
        self.mean_pass = mean_pass
        self.device = model_device(model)
        if self.rows and shape is None:
            from posprobe.capture.model import check_model

            shape = check_model(model)
        self.shape = shape
        self.retrieval = None
        self.previous = getattr(model.config, "_attn_implementation", None)

    def __enter__(self) -> StepRoute:
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

    def step(self, index: int, step: Step) -> None:
        import torch

        from posprobe.analysis.context_loss import token_nll
        from posprobe.capture.logit_blocks import window_loss
        from posprobe.runtime import distributed

        ids = torch.as_tensor(step.input_ids, device=self.device)
        if self.mean_pass:
            self.call(input_ids=ids, **{**step.kwargs, **({"logits_to_keep": 1} if self.keep_last else {})})
            return
        if self.blocked:  # logits made and reduced block by block of positions where they would not fit
            output, rows, loss = None, None, window_loss(self.model, ids, self.device, call=self.call)
        else:
            output, rows = self._forward(ids, step)
            loss = token_nll(output.logits, ids) if self.loss else None
        out = StepOutput(index, step, ids, output, self.model, loss, rows, self.taps)
        for reducer in self.reducers:
            reducer.add_output(out)
        del output, out
        if self.progress is not None and self.total is not None:
            self.progress(distributed.done_by_all(index, self.total), self.total)

    def other(self, index: int, step: Step) -> None:
        pass

    def finish(self, parallel: bool) -> bool:
        return True

    def _forward(self, ids, step: Step):
        """(model output, (B, L, H) rows or None) of one step."""
        if self.retrieval is not None:
            return self.retrieval.forward(ids, step.row, step.spans, taps=self.taps, **step.kwargs)
        return self.call(input_ids=ids, **step.kwargs), None


def _takes(model, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
