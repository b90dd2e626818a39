"""Taps: what a caller hands the attention kernel (`kernel.routes.attention`) to observe or edit one forward pass.

A `Taps` object travels down the model's forward pass as the keyword argument `posprobe_taps` (transformers passes
a forward's extra keywords on to the attention function, as AttentionInterface intends; `Taps.forward` runs a
model so, and hands it to layers of a family that drops them on the way too). It holds functions per named site;
the kernel calls them at each attention call of the layers they address, in the order they were added:

- "query", "key": (B, H, m, d_h) / (B, H_kv, keys, d_h), after the family applied positions (rotary, ...), before
  grouped-query heads are repeated;
- "mask": the call's mask as its route made it (None: sdpa's causal shortcut, or no mask for a bidirectional
  module; a bool (B or 1, 1, m, keys) tensor, True = attend; an additive float one; or the blockwise route's
  `RowMask`), after the "query" and "key" taps (`call.own` set); an edit returns a new mask of the same kind (or a
  tensor for None), which the call then uses in place of the model's: the sdpa routes stay on sdpa (a "scores" tap
  makes them compute the softmax themselves);
- "scores": (B, H, q, keys), QKᵀ·scaling (softcapped where the family softcaps) with the model's mask/bias added
  (masked pairs hold the dtype's minimum), before the softmax; an edit returns new scores (a mask added, pairs
  set to the dtype's minimum, ...). On the sdpa routes a tap here makes the call compute its softmax itself;
- "pattern": (B, H, q, keys), the softmax of the scores (learned sink columns left out: rows sum to one less the
  sink's share), before dropout and A·V; `call.scores` holds the scores it came from;
- "row": (B, H, own) float32, the probabilities the query row `Taps.row` gives the sequence's keys on the sdpa
  routes (read-only): recomputed beside sdpa's output, or, where a "scores" or "pattern" tap made the call compute
  its pattern, that pattern's row (edits included);
- "rows": (B, H, m - row, own) float32, the same for every query row from `Taps.row` to the last (read-only; not read
  where no row is set, as in `generate`'s cached steps): a few rows' patterns without the (m x m) matrix;
- "head_output": (B, m, H, d_h), each head's output before the layers' output projection.

q = m, or on the blockwise route the rows `call.rows` of one block (the "scores" and "pattern" taps run once per
block). A tap is `fn(tensor, call) -> tensor | None` (None: unchanged); `call` is the `Call` of the attention call.
Layers are addressed by the attention module's `layer_idx` (the model's layer number; where a module has none, the
call's order in the forward pass).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

SITES = ("query", "key", "mask", "scores", "pattern", "row", "rows", "head_output")
TAPS_KEY = "posprobe_taps"  # the forward keyword that carries a Taps object


@dataclass
class Call:
    """One attention call as taps see it: `module` (the attention module), `layer` (its `layer_idx`, else the
    call's order), `index` (its order among this forward pass's calls), `mask` (the mask it was given), `repeated`
    (the same module on the same query, key and mask as the previous call: DiffLlama's second softmax use), `own`
    (how many keys are the sequence's tokens, pooled entries after them left out), `selected` (keys an indexer
    picked: (B, q, keys) or per head (B, H, q, keys) bool, or None), `rows` ((start, stop) of a block's query rows,
    or None: every row), `allowed` (blockwise route: the block's allowed pairs, (B, b, keys) or (B, H, b, keys)
    bool), `scores` (set before the "pattern" taps run)."""

    module: Any
    layer: int
    index: int
    mask: Any
    repeated: bool = False
    own: int = 0
    selected: Any = None
    rows: tuple[int, int] | None = None
    allowed: Any = None
    scores: Any = None
    queries: int = 0  # the call's query rows (m)
    pattern: Any = None  # the pattern after its taps, where the kernel computed one (read by the "row" site)
    device: Any = None  # the device of the call's queries (where a mask made for it goes)


@dataclass
class Taps:
    """Functions per site (`on`), the query row the "row" site reads (`row`), and on the blockwise route the query
    rows per block (`block_rows`, None: about `kernel.routes.BLOCK_ELEMENTS` scores per block)."""

    row: int | None = None
    block_rows: int | None = None
    _sites: dict[str, list[tuple[frozenset | None, Callable]]] = field(default_factory=lambda: {s: [] for s in SITES})
    _calls: int = 0
    _last: tuple | None = None

    def on(self, site: str, fn: Callable, layers: Iterable[int] | None = None) -> Taps:
        """Add `fn(tensor, call)` at `site` for the layers `layers` (module.layer_idx; None: every layer)."""
        if site not in SITES:
            raise ValueError(f"no site '{site}'; the sites are {list(SITES)}")
        if site == "row" and self.row is None:
            raise ValueError("a 'row' tap needs Taps(row=...): the query row to read")
        self._sites[site].append((None if layers is None else frozenset(int(x) for x in layers), fn))
        return self

    def joined(self, other: Taps | None) -> Taps:
        """New taps: this one's functions at each site, then `other`'s (edits first, then what reads their effect);
        the `row` and `block_rows` of whichever sets them (this one's first)."""
        if other is None:
            return self
        taps = Taps(self.row if self.row is not None else other.row,
                    self.block_rows if self.block_rows is not None else other.block_rows)  # fmt: skip
        for site in SITES:
            taps._sites[site] = self._sites[site] + other._sites[site]
        return taps

    def wants(self, site: str) -> bool:
        return bool(self._sites[site])

    def start(self) -> None:
        """Begin a forward pass: calls are counted from 0 again."""
        self._calls, self._last = 0, None

    def enter(self, module, query, key, mask) -> Call:
        """The `Call` of an attention call of `module` on these tensors (the kernel calls this once per call)."""
        this = (module, query, key, mask)
        repeated = self._last is not None and all(a is b for a, b in zip(this, self._last, strict=True))
        self._last = this
        layer = getattr(module, "layer_idx", None)
        call = Call(module, self._calls if not isinstance(layer, int) else layer, self._calls, mask, repeated)
        call.queries, call.device = int(query.shape[-2]), query.device
        self._calls += 1
        return call

    def apply(self, site: str, tensor, call: Call):
        """`tensor` through the taps of `site` that address `call.layer`."""
        for layers, fn in self._sites[site]:
            if layers is None or call.layer in layers:
                new = fn(tensor, call)
                if new is not None:
                    tensor = new
        return tensor

    def forward(self, model, **inputs):
        """`model(**inputs)` with these taps: passed as the `posprobe_taps` keyword, and handed to every attention
        module whose layer did not pass it on (a family that drops a forward's extra keywords, Nemotron)."""
        self.start()
        with self.handed(model):
            return model(**inputs, **{TAPS_KEY: self})

    @contextlib.contextmanager
    def handed(self, model):
        """While active, every attention module of `model` gets these taps where its caller did not pass them on
        (also for calls that run the model themselves and take no extra keyword: transformers' `generate`)."""
        hooks = [m.register_forward_pre_hook(self._hand, with_kwargs=True) for m in attention_modules(model)]
        try:
            yield self
        finally:
            for hook in hooks:
                hook.remove()

    def _hand(self, module, args, kwargs):
        if kwargs.get(TAPS_KEY) is None:
            return args, {**kwargs, TAPS_KEY: self}
        return None


_CALLS_ATTENTION: dict[type, bool] = {}


def attention_modules(model) -> list:
    """The modules of `model` whose forward takes extra keywords and calls transformers' attention functions (its
    source names `ALL_ATTENTION_FUNCTIONS`), read once per class."""
    import inspect

    found = []
    for module in model.modules():
        cls = type(module)
        if cls not in _CALLS_ATTENTION:
            try:
                source = inspect.getsource(cls.forward)
                keywords = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls.forward).parameters.values())
            except (OSError, TypeError, ValueError):
                source, keywords = "", False
            _CALLS_ATTENTION[cls] = keywords and "ALL_ATTENTION_FUNCTIONS" in source
        if _CALLS_ATTENTION[cls]:
            found.append(module)
    return found
