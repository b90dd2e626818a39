"""Neighbour-chunk attention (Reformer's local layers, `Family.windows` 'neighbour_chunks'): the attention such a
layer computes per chunk, rebuilt as (queries x keys) matrices over the batch's positions, on its eager path.

Such a layer splits its (padded) sequence of M positions into C chunks of c and lets the queries of chunk k attend
the keys of chunks k - before .. k + after (modulo C: they wrap around), in one logsumexp over (B, H, C, c, W),
W = (before + 1 + after) c: no softmax call and no (queries x keys) matrix. While a batch runs, each such layer (the
module that owns the family's `query`) is called with `output_attentions` (its per-chunk probabilities P) and the
input of its logsumexp is observed (its scores D, masked pairs holding the layer's mask value). Slot s of chunk k's
key axis is key position ((k + s // c - before) mod C) c + s % c, the order in which the layer concatenates its
neighbour chunks. S (masked pairs and pairs outside the chunks at the dtype's minimum) and A (0 there) are D and P
scattered into (B, H, M, M), then cut to the batch's m positions (the model pads a sequence to a multiple of its
chunk lengths, at the end, the padding masked). A layer over at most c positions attends whole: D is (B, H, M, M).
Refused: lengths at which a chunk would be its own neighbour (C < before + 1 + after: the layer counts those keys
twice in its softmax, which no (queries x keys) matrix of pairs says).
Checked on the first batch, beside the eager route's checks, and on the first batch attended in chunks: A times the
layer's values of its own input gives the layer's output on the real positions (the rebuilt matrices are the ones
the layer applied).

Dimensions: B batch, H heads, m the batch's length, M the layer's padded length, d_h head size.
"""

from __future__ import annotations

from posprobe.capture.eager import EagerRecorder, _share_equal
from posprobe.errors import PosprobeError


def chunk_recorder(model, layers: list[int], n_heads: int) -> NeighbourChunkRecorder | None:
    """The recorder of a family whose attention layers attend neighbour chunks (`Family.windows` 'neighbour_chunks'),
    over the stack `model` runs and its attention layers `layers`; None for any other family."""
    from posprobe.capture.model import text_config
    from posprobe.families import family_for_type

    family = family_for_type(str(getattr(text_config(model), "model_type", "")))
    if family is None or family.windows != "neighbour_chunks":
        return None
    base = getattr(model, "base_model", model)
    modules = [base.get_submodule(family.query.format(l=layer).rsplit(".", 1)[0]) for layer in layers]
    return NeighbourChunkRecorder(modules, n_heads)


def neighbour_chunk_keys(chunks: int, chunk: int, before: int, after: int):
    """(chunks, (before + 1 + after) chunk) long: the key position of each slot of each chunk's key axis, for a
    layer that concatenates chunk k - before .. k + after (modulo `chunks`), in that order."""
    import torch

    slot = torch.arange((before + 1 + after) * chunk)
    neighbour = torch.arange(chunks)[:, None] + slot[None, :] // chunk - before
    return (neighbour % chunks) * chunk + slot[None, :] % chunk


def rebuild_chunks(values, chunk: int, before: int, after: int, fill: float):
    """(B, H, M, M) of per-chunk `values` (B, H, C, chunk, W) of a neighbour-chunk layer (`neighbour_chunk_keys`),
    `fill` on the pairs outside the chunks; (B, H, M, M) `values` (a layer that attends whole) are returned as
    they are. PosprobeError where a chunk is its own neighbour (its keys counted twice)."""
    import torch

    if values.dim() == 4:
        return values
    batch, heads, chunks, _, width = values.shape
    if width != (before + 1 + after) * chunk:
        raise PosprobeError(
            f"a neighbour-chunk layer computed {width} keys per chunk of {chunk}, not {(before + 1 + after) * chunk} "
            f"(its chunk, {before} before and {after} after)",
            "this family computes attention in a way posprobe attention does not record; please report it",
        )
    if chunks < before + 1 + after:
        raise PosprobeError(
            f"over {chunks * chunk} positions ({chunks} chunks of {chunk}) each local layer's chunk sees itself or a "
            f"neighbour twice (chunks before: {before}, after: {after}), counting those keys twice in its softmax",
            f"use texts of at most {chunk} tokens, or of a length the model pads to at least {before + 1 + after} "
            "chunks (--max-length)",
        )
    keys = neighbour_chunk_keys(chunks, chunk, before, after).to(values.device)
    out = torch.full((batch, heads, chunks, chunk, chunks * chunk), fill, dtype=values.dtype, device=values.device)
    out.scatter_(-1, keys[None, None, :, None, :].expand(values.shape), values)
    return out.view(batch, heads, chunks * chunk, chunks * chunk)


def logsumexp_inputs(record):
    """A TorchFunctionMode calling `record(x)` with the (detached) input of every logsumexp while active."""
    import torch
    from torch.overrides import TorchFunctionMode

    functions = (torch.logsumexp, torch.Tensor.logsumexp)

    class LogsumexpInputs(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in functions and args:
                record(args[0].detach())
            return func(*args, **(kwargs or {}))

    return LogsumexpInputs()


class NeighbourChunkRecorder(EagerRecorder):
    """`EagerRecorder` for neighbour-chunk layers (module docstring): `forward` gives each batch's (queries x keys)
    S, A and allowed pairs of its attention layers `modules`, rebuilt from what each layer computed."""

    def __init__(self, modules: list, n_heads: int):
        super().__init__(len(modules), n_heads)
        self.modules = modules
        self.layer_io: list = []  # the last batch's (layer input, layer output) per layer, for `verify`
        self.chunks_checked = False  # whether a batch attended in chunks was checked against the layers' outputs

    def forward(self, model, tokens, **kwargs):
        """(output, scores, probs, allowed) of one `TokenBatch`, as `EagerRecorder.forward`."""
        import torch

        from posprobe.capture.eager import masked_below

        batch, m = tokens.input_ids.shape
        calls: dict[int, list] = {}
        returned: dict[int, tuple] = {}
        inside: list[int] = []

        def before(layer):
            def hook(module, args, kwargs):
                inside.append(layer)
                return args, {**kwargs, "output_attentions": True}

            return hook

        def after(layer):
            def hook(module, args, kwargs, output):
                inside.pop()
                returned[layer] = (kwargs.get("hidden_states", args[0] if args else None), output)

            return hook

        hooks = []
        try:
            for layer, module in enumerate(self.modules):
                hooks.append(module.register_forward_pre_hook(before(layer), with_kwargs=True))
                hooks.append(module.register_forward_hook(after(layer), with_kwargs=True))
            record = lambda x: calls.setdefault(inside[-1], []).append(x) if inside else None  # noqa: E731
            with logsumexp_inputs(record):
                output = model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
        kind = getattr(model.config, "model_type", "unknown")
        if sorted(returned) != list(range(self.n_layers)) or any(len(calls.get(k, ())) != 1 for k in returned):
            raise PosprobeError(
                f"'{kind}' did not run one logsumexp in each of its {self.n_layers} neighbour-chunk layers",
                "this family computes attention in a way posprobe attention does not record; please report it",
            )
        scores, probs, self.layer_io = [], [], []
        chunked = any(calls[layer][0].dim() == 5 for layer in returned)
        for layer, module in enumerate(self.modules):
            dots, (x, out) = calls[layer][0], returned[layer]
            if not torch.is_tensor(out.attention_probs) or out.attention_probs.shape != dots.shape:
                raise PosprobeError(
                    f"'{kind}' layer {layer} returned no per-chunk attention of its scores' shape {tuple(dots.shape)}",
                    "this family computes attention in a way posprobe attention does not record; please report it",
                )
            low = torch.finfo(dots.dtype).min
            mask = getattr(module, "mask_value_float16" if dots.dtype == torch.float16 else "mask_value_float32")
            dots = torch.where(dots == mask.to(dots.dtype), low, dots)  # the layer's masked pairs
            shape = (module.chunk_length, module.num_chunks_before, module.num_chunks_after)
            scores.append(rebuild_chunks(dots, *shape, low)[:, :, :m, :m])
            probs.append(rebuild_chunks(out.attention_probs.detach(), *shape, 0.0)[:, :, :m, :m])
            self.layer_io.append((x, out.hidden_states))
        allowed = _share_equal([s[:, 0] > masked_below(s) for s in scores])
        if chunked and not self.chunks_checked:
            self.check_outputs(model, tokens, probs)
            self.chunks_checked = True
        return output, scores, tuple(probs), allowed

    def verify(self, model, tokens, output, scores, probs, allowed) -> None:
        """`EagerRecorder.verify`, then `check_outputs`."""
        super().verify(model, tokens, output, scores, probs, allowed)
        self.check_outputs(model, tokens, probs)

    def check_outputs(self, model, tokens, probs) -> None:
        """A times each layer's values of its own input is the layer's output on the real positions (the last
        batch's); PosprobeError where it is not."""
        import torch

        kind = getattr(model.config, "model_type", "unknown")
        real = tokens.attention_mask.bool()  # (B, m)
        m = real.shape[1]
        for layer, (module, a, (x, out)) in enumerate(zip(self.modules, probs, self.layer_io)):
            batch, heads = a.shape[:2]
            values = module.value(x[:, :m]).view(batch, m, heads, -1).transpose(1, 2)  # (B, H, m, d_h)
            ours = (a.double() @ values.double()).transpose(1, 2).reshape(batch, m, -1)
            theirs = out[:, :m].double()
            gap = ((ours - theirs).abs().amax(-1)[real].max() / theirs[real].abs().max().clamp_min(1e-30)).item()
            tol = 1e-4 if a.dtype in (torch.float32, torch.float64) else 2e-2
            if not gap <= tol:
                raise PosprobeError(
                    f"the attention rebuilt from the chunks of layer {layer} of '{kind}' does not give that layer's "
                    f"output (relative difference {gap:.2e})",
                    "this family computes attention in a way posprobe attention does not record; please report it",
                )
