"""Edits applied to a loaded model (SPEC §20): `EditRun(model, edits)` turns parsed edits into taps on the attention
kernel (`posprobe.kernel.Taps`: head, attend, band) and forward hooks (shift on the model's position ids, rope-keep on
its rotary modules' (cos, sin), channel on block outputs), installed while the run is entered and removed after it,
even on error.

- head L.H: the "head_output" site (B, m, H, d_h): head H multiplied by 0, plus its mean (`=mean`);
- attend S,W: the "mask" site: pairs outside j < S or i - W < j <= i (bidirectional: |i - j| < W) masked in the
  call's own mask (bool: False; additive: the dtype's minimum; the blockwise route's row masks block by block), so
  the sdpa routes stay on sdpa; query i is the call's row, offset by the keys before the call's queries (a cache);
- band L.F: the "query" and "key" sites (B, H, m, d_h), after rotation: the pair's two dims multiplied by 0 (dims F
  and F + r/2 rotate-half, 2F and 2F + 1 interleaved; r the rotated dims, the first of each head);
- rope-keep P: a forward hook on each rotary module: on the columns of pairs outside the round(P n) highest
  frequencies (of n), cos := sqrt(cos² + sin²) (the module's attention scaling) and sin := 0;
- shift N: a forward pre-hook on the model: position_ids + N (made from the cache position where not given);
- channel L.C: a forward hook on block L: channel C of its output hidden state set to 0, or to its mean.

Means (`=mean`) are over every real token of the run's forward passes without edits: `MeanPass` collects them in a
first pass (sums and counts, added over torchrun ranks), and `EditRun(..., means=)` uses them.

Dimensions: B batch, H query heads, m tokens, d_h head size, d hidden size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from posprobe.edits.spec import (
    AttendEdit,
    BandEdit,
    ChannelEdit,
    Edit,
    EditModel,
    HeadEdit,
    RopeKeepEdit,
    ShiftEdit,
    edit_layers,
    edit_model,
)
from posprobe.errors import PosprobeError
from posprobe.kernel import Taps


def model_of(model) -> EditModel:
    """The `EditModel` of a loaded model, from its config."""
    config = model.config.to_dict()
    config.setdefault("model_type", getattr(model.config, "model_type", "unknown"))
    return edit_model(config, str(getattr(model.config, "_name_or_path", "") or "model"))


def uses_kernel(edits: Sequence[Edit]) -> bool:
    """True when some edit acts inside attention (it needs the kernel's route)."""
    return any(isinstance(e, (HeadEdit, AttendEdit, BandEdit)) for e in edits)


def block_modules(model, layers: int) -> list:
    """The model's blocks (layers) in order: its first ModuleList of `layers` entries named like layers/h/blocks."""
    from torch import nn

    fallback = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == layers:
            if name.rsplit(".", 1)[-1] in ("layers", "layer", "h", "blocks", "block", "decoder_layers"):
                return list(module)
            fallback = fallback or list(module)
    if fallback is None:
        raise PosprobeError(f"posprobe cannot find the {layers} blocks of '{type(model).__name__}' to edit a channel",
                            "channel edits need a model whose layers are one ModuleList")  # fmt: skip
    return fallback


def _hidden(output):
    return output[0] if isinstance(output, tuple) else output


def _with_hidden(output, hidden):
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


class MeanPass:
    """A first pass's collector of the means `=mean` edits use: per head edit layer, the sum over real tokens of
    head outputs (H, d_h); per channel edit layer, of the block output (d,); and the token counts. `taps` to run
    the forward passes with, `real` (B, m) bool set by the caller before each pass where some tokens are padding
    (None: all real). `means()` after the passes: {('head', L): (H, d_h), ('channel', L): (d,)} float tensors,
    added over torchrun ranks."""

    def __init__(self, model, edits: Sequence[Edit], em: EditModel | None = None):
        em = em or model_of(model)
        self.model, self.real = model, None
        self.sums: dict[tuple[str, int], Any] = {}
        self.counts: dict[tuple[str, int], int] = {}
        head_layers = sorted({x for e in edits if isinstance(e, HeadEdit) and e.value == "mean"
                              for layer, _ in e.heads for x in edit_layers(layer, em, True)})  # fmt: skip
        channel_layers = sorted({x for e in edits if isinstance(e, ChannelEdit) and e.value == "mean"
                                 for layer, _ in e.channels for x in edit_layers(layer, em, False)})  # fmt: skip
        self.taps = Taps().on("head_output", self._head, head_layers) if head_layers else None
        self.channel_layers = channel_layers
        self.keys = [("head", x) for x in head_layers] + [("channel", x) for x in channel_layers]
        self.blocks = block_modules(model, em.layers) if channel_layers else []
        self.hooks: list = []

    def _add(self, key, tensor) -> None:  # tensor (B, m, ...)
        real = self.real
        if real is not None:
            tensor = tensor[real.to(tensor.device)]
            count = int(real.sum())
        else:
            count = tensor.shape[0] * tensor.shape[1]
            tensor = tensor.reshape(-1, *tensor.shape[2:])
        total = tensor.double().sum(0).cpu()
        self.sums[key] = self.sums[key] + total if key in self.sums else total
        self.counts[key] = self.counts.get(key, 0) + count

    def _head(self, out, call):
        self._add(("head", call.layer), out)

    def __enter__(self) -> MeanPass:
        for layer in self.channel_layers:
            hook = lambda module, args, output, layer=layer: self._add(("channel", layer), _hidden(output))  # noqa: E731
            self.hooks.append(self.blocks[layer].register_forward_hook(hook, prepend=True))
        return self

    def __exit__(self, *exc) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def means(self, parallel: bool = False) -> dict:
        """The means (`parallel`: sums and counts added over the torchrun ranks first)."""
        from posprobe.runtime import distributed

        out = {}
        for key in self.keys:  # the same keys in the same order on every rank (one without a step sends None)
            total, count = self.sums.get(key), self.counts.get(key, 0)
            if parallel:
                total, count = distributed.all_reduce_sum(total), distributed.all_reduce_sum(count)
            if total is not None:
                out[key] = total / max(count, 1)
        return out


class EditRun:
    """Edits applied to `model` while entered: `taps` (kernel taps, or None where no edit acts inside attention) to
    join to a run's own taps, the hooks installed on entry and removed on exit. `means` from a `MeanPass` where an
    edit asks for `=mean`."""

    def __init__(self, model, edits: Sequence[Edit], means: dict | None = None, em: EditModel | None = None):
        import torch

        self.model, self.edits, self.means = model, tuple(edits), means or {}
        self.em = em or model_of(model)
        self.hooks: list = []
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        self.dtype = dtype
        taps = Taps()
        self._head_taps(taps)
        for edit in self.edits:
            if isinstance(edit, AttendEdit):
                taps.on("mask", self._attend(edit), self.em.attention_layers)
        self._band_taps(taps)
        self.taps = taps if uses_kernel(self.edits) else None

    # ---- head outputs
    def _head_taps(self, taps: Taps) -> None:
        import torch

        zero: dict[int, set[int]] = {}
        mean: dict[int, set[int]] = {}
        for edit in self.edits:
            if isinstance(edit, HeadEdit):
                if edit.select is not None:
                    raise PosprobeError(f"the edit '{edit.text}' names heads by a measurement that posprobe ablate "
                                        "resolves", "use posprobe ablate, or name the heads: head:L.H")  # fmt: skip
                target = mean if edit.value == "mean" else zero
                for layer, head in edit.heads:
                    for x in edit_layers(layer, self.em, True):
                        target.setdefault(x, set()).update(range(self.em.heads) if head is None else {head})
        for layer in sorted(set(zero) | set(mean)):
            keep = torch.ones(self.em.heads, dtype=torch.float64)
            fill = None
            for h in zero.get(layer, set()) | mean.get(layer, set()):
                keep[h] = 0.0
            if mean.get(layer):
                if ("head", layer) not in self.means:
                    raise PosprobeError(f"no mean of layer {layer}'s head outputs was collected",
                                        "run =mean edits where a first pass collects means (MeanPass)")  # fmt: skip
                fill = self.means[("head", layer)].clone()  # (H, d_h)
                for h in range(self.em.heads):
                    if h not in mean[layer] or h in zero.get(layer, set()):
                        fill[h] = 0.0
            taps.on("head_output", self._head_fn(keep, fill), [layer])

    @staticmethod
    def _head_fn(keep, fill):
        cache: dict = {}

        def edit(out, call):  # out (B, m, H, d_h)
            key = (out.device, out.dtype)
            if key not in cache:
                cache[key] = (keep.to(out.device, out.dtype).reshape(1, 1, -1, 1),
                              None if fill is None else fill.to(out.device, out.dtype)[None, None])  # fmt: skip
            k, f = cache[key]
            return out * k if f is None else out * k + f

        return edit

    # ---- attention window with sinks
    def _attend(self, edit: AttendEdit):
        """A "mask" tap: the call's mask and the allowed pairs (j < S or i - W < j <= i; bidirectional |i - j| < W),
        query i the call's row numbered after the keys before its queries (a cache). A tensor mask is edited (bool:
        and; additive: the dtype's minimum), None (sdpa's causal shortcut, or none for a bidirectional module) made
        a bool mask, a `RowMask` (blockwise route) edited block by block of rows."""
        import copy

        import torch

        sinks, window = edit.sinks, edit.window
        cache: dict = {}

        def allowed(rows: int, keys: int, offset: int, own: int, causal: bool, device):  # (rows, keys) bool
            key = (rows, keys, offset, own, causal, device)
            if key not in cache:
                i = torch.arange(offset, offset + rows, device=device)[:, None]
                j = torch.arange(keys, device=device)[None, :]
                near = (j <= i) & (j > i - window) if causal else (i - j).abs() < window
                cache[key] = near | (j < sinks) | (j >= own)  # pooled entries after the tokens: as they are
            return cache[key]

        def mask_edit(mask, call):
            own = call.own
            offset = max(0, own - call.queries)  # keys before this call's queries (a cache)
            module_causal = getattr(call.module, "is_causal", True) and self.em.causal
            if mask is None:
                keys = own
                ok = allowed(call.queries, keys, offset, own, module_causal, call.device)
                if module_causal:
                    ok = ok & (torch.arange(keys, device=ok.device)[None] <= offset + torch.arange(
                        call.queries, device=ok.device)[:, None])  # fmt: skip
                return ok[None, None]
            if hasattr(mask, "rows") and not isinstance(mask, torch.Tensor):  # RowMask: edited per block of rows
                edited, rows_of = copy.copy(mask), mask.rows

                def rows(start: int, stop: int):
                    block = rows_of(start, stop)
                    ok = allowed(stop - start, block.shape[-1], offset + start, own, self.em.causal, block.device)
                    return block & ok

                edited.rows = rows
                return edited
            ok = allowed(mask.shape[-2], mask.shape[-1], offset, own, self.em.causal, mask.device)
            if mask.dtype == torch.bool:
                return mask & ok
            return mask.masked_fill(~ok, torch.finfo(mask.dtype).min)

        return mask_edit

    # ---- rotary pairs
    def pair_dims(self, pair: int) -> tuple[int, int]:
        """The two dims of rotary pair `pair` in each query and key head (the model's own pairing)."""
        if self.em.layout in ("interleaved", "half-interleaved"):
            return 2 * pair, 2 * pair + 1
        return pair, pair + self.em.rotated // 2

    def _band_taps(self, taps: Taps) -> None:
        import torch

        per_layer: dict[int, set[int]] = {}
        for edit in self.edits:
            if isinstance(edit, BandEdit):
                for layer, pair in edit.pairs:
                    for x in edit_layers(layer, self.em, True):
                        per_layer.setdefault(x, set()).update(self.pair_dims(pair))
        for layer, dims in sorted(per_layer.items()):
            keep = torch.ones(self.em.head_dim, dtype=torch.float64)
            keep[sorted(dims)] = 0.0
            fn = self._head_fn_dims(keep)
            taps.on("query", fn, [layer]).on("key", fn, [layer])

    @staticmethod
    def _head_fn_dims(keep):
        cache: dict = {}

        def edit(x, call):  # x (B, H, m, d_h)
            key = (x.device, x.dtype)
            if key not in cache:
                cache[key] = keep.to(x.device, x.dtype)
            return x * cache[key]

        return edit

    def _rope_keep(self, edit: RopeKeepEdit, module) -> None:
        import torch

        from posprobe.families import rope_variants as R

        interleaved = self.em.layout == "interleaved"
        cache: dict = {}

        def hook(mod, args, kwargs, output):
            layer_type = kwargs.get("layer_type", args[2] if len(args) > 2 else None)
            cos, sin = output
            key = (layer_type, cos.device)
            if key not in cache:
                inv_freq = R.inv_freq_of(mod, layer_type)[0].detach().double()
                n = inv_freq.shape[-1]
                kept = math.floor(edit.fraction * n + 0.5)
                dropped = torch.argsort(-inv_freq, stable=True)[kept:]
                cols = torch.cat([2 * dropped, 2 * dropped + 1]) if interleaved else torch.cat([dropped, dropped + n])
                cache[key] = cols.to(cos.device)
            cols = cache[key]
            if cols.numel() == 0:
                return None
            radius = torch.sqrt(cos[..., cols].float() ** 2 + sin[..., cols].float() ** 2).to(cos.dtype)
            cos, sin = cos.clone(), sin.clone()
            cos[..., cols] = radius
            sin[..., cols] = 0
            return cos, sin

        self.hooks.append(module.register_forward_hook(hook, with_kwargs=True, prepend=True))

    # ---- position ids
    def _shift(self, edit: ShiftEdit) -> None:
        import torch

        def pre_hook(module, args, kwargs):
            position_ids = kwargs.get("position_ids")
            if position_ids is None:
                ids = kwargs.get("input_ids", args[0] if args else None)
                if ids is None:
                    ids = kwargs.get("inputs_embeds")
                m, device = ids.shape[1], ids.device
                cache = kwargs.get("past_key_values")
                past = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
                position_ids = torch.arange(past, past + m, device=device)[None].expand(ids.shape[0], m)
            return args, {**kwargs, "position_ids": position_ids + edit.offset}

        self.hooks.append(self.model.register_forward_pre_hook(pre_hook, with_kwargs=True, prepend=True))

    # ---- block outputs
    def _channels(self) -> None:
        per_layer: dict[int, dict[int, str]] = {}
        for edit in self.edits:
            if isinstance(edit, ChannelEdit):
                for layer, channel in edit.channels:
                    for x in edit_layers(layer, self.em, False):
                        per_layer.setdefault(x, {})[channel] = edit.value
        if not per_layer:
            return
        blocks = block_modules(self.model, self.em.layers)
        for layer, channels in sorted(per_layer.items()):
            zero = sorted(c for c, v in channels.items() if v == "zero")
            mean = sorted(c for c, v in channels.items() if v == "mean")
            values = None
            if mean:
                if ("channel", layer) not in self.means:
                    raise PosprobeError(f"no mean of block {layer}'s output was collected",
                                        "run =mean edits where a first pass collects means (MeanPass)")  # fmt: skip
                values = self.means[("channel", layer)][mean]

            def hook(module, args, output, zero=zero, mean=mean, values=values):
                hidden = _hidden(output).clone()
                if zero:
                    hidden[..., zero] = 0
                if mean:
                    hidden[..., mean] = values.to(hidden.device, hidden.dtype)
                return _with_hidden(output, hidden)

            self.hooks.append(blocks[layer].register_forward_hook(hook, prepend=True))  # before recorders' hooks

    def __enter__(self) -> EditRun:
        from posprobe.families import rope_variants as R

        try:
            for edit in self.edits:
                if isinstance(edit, ShiftEdit):
                    self._shift(edit)
                if isinstance(edit, RopeKeepEdit):
                    modules = [module for _, _, module in R.rotary_modules(self.model)]
                    if not modules:
                        raise PosprobeError(f"'{self.em.name}' has no transformers rotary module to edit",
                                            "rope-keep edits the (cos, sin) of a rotary module")  # fmt: skip
                    for module in modules:
                        self._rope_keep(edit, module)
            self._channels()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
