"""The eager route: capture the attention of a family whose attention does not go through transformers'
AttentionInterface (T5, BLOOM, MPT, Falcon, DeBERTa, MPNet, RoFormer, BART's encoder, ...), without editing it.

The model runs its own eager attention with `output_attentions=True`: the probabilities A are the model's own
returned attentions, and the pre-softmax scores S are the input of the softmax that produced them, observed by a
`torch.overrides.TorchFunctionMode` (it sees every `softmax` call of the forward pass, whatever the model calls it
through, and changes nothing). S is therefore what the model itself feeds its softmax: q·k scaled as the family
scales it, plus its relative bias, ALiBi or disentangled terms, plus its additive mask (masked pairs hold the
dtype's minimum or -inf). The softmax calls kept are those over the key axis of a (B, H, m, m) tensor, in depth
order (or of a (B, H, m, m + 1) one whose last column is a sink logit per query, kept without it: Inkling 2), none
inside the modules whose softmax runs over depth (`depth_attention_modules`); every batch must give exactly one per
layer.

Every batch: exactly one such softmax per layer, and one returned attention per layer of shape (B, H, m, m) (a
family whose attention is computed in sliding chunks or blocks, Longformer or LongT5, is refused). Two families
return something else: SqueezeBERT returns the very tensor it feeds its softmax (its scores) as "attentions", and
transformers' BigBird returns none once it has swapped its attention modules (it does so itself on inputs short
enough for full attention, and the capture does it up front, see `capture.run`); A is then the output of the
recorded softmax. Checks on the first batch (`verify`): the softmax of each layer's S equals the A the model
returned on real query rows (so S is that layer's attention input, not another softmax); the pairs S marks as
masked are those A gives nothing, and padding keys are masked for every real query (the mask convention is
understood); and where the family also runs with sdpa, the eager outputs equal the sdpa outputs (an eager path
that computes another model, such as transformers' Falcon-ALiBi, which adds its bias twice, is refused).

Dimensions: B batch, H heads, m sequence length, L layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posprobe.errors import PosprobeError

if TYPE_CHECKING:
    import torch


def _softmax_functions() -> tuple:
    import torch

    return (torch.nn.functional.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax)


def module_attentions(model, modules: list, depths: list[int], n_heads: int, batch: int, m: int, run) -> tuple:
    """(output, scores, probs) of `run()`, the model's forward pass on a batch of `batch` rows of `m` tokens, with
    each of `modules` (the attention modules of the recorded layers `depths`) hooked: per module, the input S of
    the one (queries x keys) softmax made inside it, and the attention A it returns, each (B, H, m, m). For models
    whose forward pass makes softmaxes of other shapes beside them (BLT's patches, Funnel's pooled blocks).
    PosprobeError where a module made other than one such softmax or returned no attention of that shape."""
    running: list[int] = []  # the recorded layer whose module is running now
    seen: list[list] = [[] for _ in modules]
    returned: list = [None] * len(modules)

    def enter(index):
        return lambda *_: running.append(index)

    def leave(index):
        def hook(module, args, out):
            running.pop()
            returned[index] = out[1] if isinstance(out, tuple) and len(out) > 1 else None

        return hook

    def keep(x, out) -> None:
        if running:
            seen[running[-1]].append(x)

    hooks = []
    try:
        for index, module in enumerate(modules):
            hooks += [module.register_forward_pre_hook(enter(index)), module.register_forward_hook(leave(index))]
        with observe_attention_softmaxes(batch, n_heads, m, keep):
            output = run()
    finally:
        for hook in hooks:
            hook.remove()
    kind = getattr(model.config, "model_type", "unknown")
    for depth, calls, probs in zip(depths, seen, returned, strict=True):
        if len(calls) != 1 or probs is None or tuple(probs.shape) != (batch, n_heads, m, m):
            raise PosprobeError(
                f"'{kind}' made {len(calls)} (queries x keys) softmax calls in its layer {depth}'s attention and "
                f"returned {'no' if probs is None else tuple(probs.shape)} attention for (batch, heads, {m}, {m})",
                "this family computes attention in a way posprobe attention does not record; please report it",
            )
    return output, [calls[0] for calls in seen], tuple(p.detach() for p in returned)


def observe_attention_softmaxes(batch: int, heads: int, m: int, seen, outside=()):
    """A context manager that, while active, calls `seen(x, out)` for every softmax over the last axis of a
    (batch, *, m, m) tensor, or of a (batch * heads, m, m) one (heads folded into the batch, XGLM), with input and
    output detached and seen as (batch, H, m, m) (a TorchFunctionMode: it observes, it changes nothing). A softmax
    over m + 1 columns, the keys and a last one with no key (a sink logit per query: Inkling 2's input-conditioned
    sinks), is seen without that column: the keys' scores, and probabilities summing to one less the sink's share;
    the mode's `sink_columns` says, per call seen, whether it had one. Softmaxes inside the modules `outside`
    (`depth_attention_modules`) are not seen."""
    from torch.overrides import TorchFunctionMode

    functions = _softmax_functions()

    class AttentionSoftmaxes(TorchFunctionMode):
        def __enter__(self):
            self.inside, self.hooks = [], []
            for module in outside:
                self.hooks.append(module.register_forward_pre_hook(lambda *_: self.inside.append(1)))
                self.hooks.append(module.register_forward_hook(lambda *_: self.inside.pop() and None))  # None
            return super().__enter__()

        def __exit__(self, *exc):
            for hook in self.hooks:
                hook.remove()
            return super().__exit__(*exc)

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func in functions and args and not self.inside:
                x = args[0]
                dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
                sink = x.dim() >= 3 and tuple(x.shape[-2:]) == (m, m + 1)
                if x.dim() < 3 or (tuple(x.shape[-2:]) != (m, m) and not sink) or dim not in (-1, x.dim() - 1):
                    return out
                x, y = (x[..., :m], out[..., :m]) if sink else (x, out)  # the model gets `out`, unchanged
                if x.dim() == 4 and x.shape[0] == batch:
                    self.sink_columns.append(sink)
                    seen(x.detach(), y.detach())
                elif x.dim() == 3 and x.shape[0] == batch * heads:
                    self.sink_columns.append(sink)
                    seen(x.detach().reshape(batch, heads, m, m), y.detach().reshape(batch, heads, m, m))
            return out

    mode = AttentionSoftmaxes()
    mode.sink_columns = []
    return mode


def softmax_inputs(batch: int, heads: int, m: int, outside=()):
    """`observe_attention_softmaxes` keeping every (input, output) pair, (batch, H, m, m) each, in its `calls`."""
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    mode = observe_attention_softmaxes(batch, heads, m, lambda x, out: calls.append((x, out)), outside)
    mode.calls = calls
    return mode


def depth_attention_modules(model) -> list:
    """The modules of `model` whose softmax runs over depth, not positions (module names in its family's
    `tensors['depth_attention']`: Inkling 2's attention over blocks of layers): no attention to record."""
    from posprobe.families import family_for_type

    family = family_for_type(str(getattr(model.config, "model_type", "")))
    names = set(family.tensors.get("depth_attention", "").split(",")) - {""} if family else set()
    return [module for name, module in model.named_modules() if name.rsplit(".", 1)[-1] in names]


MASKED_BELOW = -1e30  # no real score comes near; masks add a dtype's minimum (-3.4e38 in float32) or -inf
MASKED_EXACTLY = -1e4  # OpenAI GPT's causal mask sets the score to exactly this: w * b - 1e4 * (1 - b), b = 0


def masked_below(scores: torch.Tensor) -> float:
    """The score below which a pair counts as masked: -1e30, or half the dtype's minimum where that is higher
    (float16: -32752). Some families mask in float32 inside a float64 model (GPT-Neo's windows), so the minimum of
    the scores' own dtype is not the bound."""
    import torch

    return max(torch.finfo(scores.dtype).min / 2, MASKED_BELOW)


class EagerRecorder:
    """Runs batches through the model's eager attention (`start` switches it there, `stop` restores it) and
    returns what each of its `n_layers` layers did."""

    def __init__(self, n_layers: int, n_heads: int):
        self.n_layers, self.n_heads = n_layers, n_heads
        self.previous: str | None = None

    def start(self, model) -> None:
        self.previous = getattr(model.config, "_attn_implementation", None)
        if self.previous != "eager":
            model.set_attn_implementation("eager")

    def stop(self, model) -> None:
        if self.previous is not None and self.previous != "eager":
            model.set_attn_implementation(self.previous)

    def forward(self, model, tokens, **kwargs) -> tuple[Any, list, tuple, list]:
        """(output, scores, probs, allowed) of one `TokenBatch`: per layer S and A (B, H, m, m) and the pairs the
        model lets query i see key j, (B, m, m) bool (layers with equal masks share one tensor). PosprobeError
        when the forward pass did not give one (queries x keys) softmax and one returned attention per layer."""
        batch, m = tokens.input_ids.shape
        with softmax_inputs(batch, self.n_heads, m, depth_attention_modules(model)) as seen:
            output = model(
                input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, output_attentions=True, **kwargs
            )
        kind = getattr(model.config, "model_type", "unknown")
        returned = getattr(output, "attentions", None)
        if returned and (len(returned) != self.n_layers or any(a is None for a in returned)):
            raise PosprobeError(
                f"'{kind}' did not return one attention matrix per layer with output_attentions",
                "this family's attention cannot be recorded",
            )
        if returned and any(a.dim() != 4 or tuple(a.shape) != (batch, a.shape[1], m, m) for a in returned):
            raise PosprobeError(
                f"'{kind}' returns attentions of shape {tuple(returned[0].shape)}, not (batch, heads, {m}, {m}): "
                "its attention is not one softmax over all keys (sliding chunks, blocks or global tokens)",
                "this family's attention cannot be recorded as (queries x keys) matrices",
            )
        if len(seen.calls) != self.n_layers:
            raise PosprobeError(
                f"'{kind}' made {len(seen.calls)} softmax calls over (queries x keys) for {self.n_layers} layers",
                "this family computes attention in a way posprobe attention does not record",
            )
        if not returned:  # transformers' BigBird returns none once it has swapped its attention modules
            returned = [out for _, out in seen.calls]
        # softmaxes with a sink column: their output on the keys is what `verify` checks the returned A against
        self.sink_outputs = [out if sink else None for (_, out), sink in zip(seen.calls, seen.sink_columns)]
        scores = [s for s, _ in seen.calls]
        # A is what the model returns, except where it returns the very tensor it fed its softmax (SqueezeBERT
        # returns its scores as "attentions"): then A is that softmax's output
        probs = tuple(out if a.data_ptr() == s.data_ptr() else a.detach() for a, (s, out) in zip(returned, seen.calls))
        allowed = _share_equal([(s[:, 0] > masked_below(s)) & (s[:, 0] != MASKED_EXACTLY) for s in scores])
        return output, scores, probs, allowed

    def verify(self, model, tokens, output, scores, probs, allowed) -> None:
        """The first-batch checks (module docstring); PosprobeError when one fails."""
        import torch

        kind = getattr(model.config, "model_type", "unknown")
        real = tokens.attention_mask.bool()  # (B, m)
        rows = real[:, None, :, None]  # real query rows, (B, 1, m, 1)
        sink_outputs = getattr(self, "sink_outputs", [None] * len(scores))
        for layer, (s, a, sunk) in enumerate(zip(scores, probs, sink_outputs)):
            # the softmax of S, or where it ran over a sink column too, its output on the keys
            ours = torch.softmax(s.double(), dim=-1) if sunk is None else sunk.double()
            gap = torch.where(rows, (ours - a.double()).abs(), 0.0).max()
            tol = 1e-4 if a.dtype in (torch.float32, torch.float64) else 2e-2
            if not torch.isfinite(gap) or gap > tol:
                raise PosprobeError(
                    f"the softmax input recorded in layer {layer} of '{kind}' does not give its returned attention "
                    f"(largest difference {float(gap):.2e})",
                    "this family computes attention in a way posprobe attention does not record; please report it",
                )
            pairs = allowed[layer]  # (B, m, m)
            seen = (a > 0).any(1)  # (B, m, m): pairs some head attends
            leaked = (seen & ~pairs)[real]  # real query rows
            padding_seen = (pairs & ~real[:, None, :])[real]
            if bool(leaked.any()) or bool(padding_seen.any()):
                raise PosprobeError(
                    f"'{kind}' masks pairs in a way posprobe attention does not recognise (layer {layer}: "
                    f"{int(leaked.sum())} masked pairs attended, {int(padding_seen.sum())} padding keys not masked)",
                    "this family's mask convention is not supported; please report it",
                )
        _compare_with_sdpa(model, tokens, output)


def _share_equal(masks: list) -> list:
    """The same tensor object for equal masks (reducers compute per-mask quantities once)."""
    import torch

    distinct: list = []
    out = []
    for mask in masks:
        same = next((d for d in distinct if torch.equal(d, mask)), None)
        if same is None:
            distinct.append(mask)
            same = mask
        out.append(same)
    return out


def _compare_with_sdpa(model, tokens, output) -> None:
    """Where the family also runs with sdpa (its usual default), the eager run must give the same outputs."""
    from posprobe.kernel.routes import relative_gap

    if not getattr(type(model), "_supports_sdpa", False):
        return
    try:
        model.set_attn_implementation("sdpa")
    except (ValueError, ImportError):  # not available for this model after all
        return
    try:
        reference = model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask)
    finally:
        model.set_attn_implementation("eager")
    gap, tol = relative_gap(output, reference, tokens.attention_mask)
    if gap > tol:
        kind = getattr(model.config, "model_type", "unknown")
        raise PosprobeError(
            f"the eager attention of '{kind}' (the path whose scores can be recorded) gives other outputs than its "
            f"sdpa attention (relative difference {gap:.2e}): transformers' eager code computes another model here",
            "measure a configuration whose eager and sdpa attention agree; please report it",
        )


def is_eager_route(model: Any) -> bool:
    """True when the model's attention is captured on its eager path (it does not support attention backends)."""
    return not (hasattr(type(model), "is_backend_compatible") and type(model).is_backend_compatible())
