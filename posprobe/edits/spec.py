"""Edits as the user writes them (`--edit KIND:ARGS`, SPEC §20): parsed into frozen dataclasses, then checked against
a model's config before any weight is read (`check_edits`). Pure: no torch, no model.

| written | parsed |
|---|---|
| `head:L.H[,L.H|,H ...][=zero|=mean]` | `HeadEdit(heads=((L, H), ...) with None for '*', value)` |
| `attend:S,W` | `AttendEdit(sinks=S, window=W)` |
| `band:L.F[,...]` (F a pair or a range a-b) | `BandEdit(pairs=((L, F), ...))` |
| `rope-keep:P` | `RopeKeepEdit(fraction=P)` |
| `shift:N` | `ShiftEdit(offset=N)` |
| `channel:L.C[,...][=zero|=mean]` | `ChannelEdit(channels=((L, C), ...), value)` |

In a comma list an item without a dot continues the previous item's layer: `head:21.8,9` is heads 8 and 9 of layer
21; `head:21.8,18.6` heads 21.8 and 18.6. `*` is every layer (every attention layer on a hybrid) or every head;
`a-b` a range, both ends included. Every problem raises `ArgumentValueError('edit', ...)`: one line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from posprobe.errors import ArgumentTypeError, ArgumentValueError

ALL = None  # '*' in a selection
KINDS = ("head", "attend", "band", "rope-keep", "shift", "channel")
_HINT = "e.g. --edit head:21.8,18.6=mean, attend:4,60, band:*.0-7, rope-keep:0.5, shift:1000, channel:3.123=zero"


@dataclass(frozen=True)
class HeadEdit:
    """Head outputs (attention-weighted values, before the output projection) set to 0 or their mean.
    `heads`: (layer, head) pairs, None for '*'; `value` 'zero' or 'mean'; `select` (name, K) where heads are named
    by a measurement of the run (`head:retrieval:K`), resolved by whoever measures it."""

    text: str
    heads: tuple[tuple[int | None, int | None], ...] = ()
    value: str = "zero"
    select: tuple[str, int] | None = None


@dataclass(frozen=True)
class AttendEdit:
    """Query i attends keys j < `sinks` or i - `window` < j <= i (bidirectional models: |i - j| < window)."""

    text: str
    sinks: int
    window: int


@dataclass(frozen=True)
class BandEdit:
    """Rotary pair F of every query and key head of layer L set to 0: `pairs` (layer or None for '*', pair)."""

    text: str
    pairs: tuple[tuple[int | None, int], ...]


@dataclass(frozen=True)
class RopeKeepEdit:
    """p-RoPE: rotation kept on the fraction `fraction` of pairs with the highest frequency, the others unrotated."""

    text: str
    fraction: float


@dataclass(frozen=True)
class ShiftEdit:
    """Position ids + `offset` for every token."""

    text: str
    offset: int


@dataclass(frozen=True)
class ChannelEdit:
    """Channel C of the hidden state after block L set to 0 or its mean: `channels` (layer or None, channel)."""

    text: str
    channels: tuple[tuple[int | None, int], ...]
    value: str = "zero"


Edit = HeadEdit | AttendEdit | BandEdit | RopeKeepEdit | ShiftEdit | ChannelEdit


def refuse(text: str, why: str, hint: str = _HINT) -> ArgumentValueError:
    return ArgumentValueError("edit", f"{{arg}} '{text}': {why}", hint)


def parse_edits(edits: Iterable[str | Edit] | str | None) -> tuple[Edit, ...]:
    """Edits from their strings (parsed ones pass through); None or [] gives ()."""
    if edits is None:
        return ()
    if isinstance(edits, (str, *_TYPES)):
        edits = [edits]
    if not isinstance(edits, Iterable):
        raise ArgumentTypeError("edit", "{arg} must be a list of edit strings", _HINT)
    return tuple(e if isinstance(e, _TYPES) else parse_edit(e) for e in edits)


def parse_edit(text: str) -> Edit:
    """One edit from `KIND:ARGS`."""
    if not isinstance(text, str):
        raise ArgumentTypeError("edit", f"{{arg}} must be a string like 'head:3.1', got {text!r}", _HINT)
    text = text.strip()
    kind, colon, args = text.partition(":")
    kind = kind.strip().lower()
    if not colon or kind not in KINDS:
        raise refuse(text, f"unknown kind '{kind}'; the kinds are {', '.join(KINDS)}")
    args = args.strip()
    if not args:
        raise refuse(text, f"'{kind}' needs arguments")
    if kind == "head":
        selection, value = _value(text, args)
        named = re.fullmatch(r"([a-z]+):(\S+)", selection)
        if named:
            return HeadEdit(text, (), value, (named.group(1), _whole(text, named.group(2), minimum=1)))
        return HeadEdit(text, _pairs(text, selection, star_second=True), value)
    if kind == "attend":
        parts = args.split(",")
        if len(parts) != 2:
            raise refuse(text, "attend takes S,W: S sink tokens, a window of W", "e.g. --edit attend:4,60")
        return AttendEdit(text, _whole(text, parts[0], minimum=0), _whole(text, parts[1], minimum=1))
    if kind == "band":
        return BandEdit(text, _pairs(text, args, star_second=False))
    if kind == "rope-keep":
        fraction = _number(text, args)
        if not 0.0 <= fraction <= 1.0:
            raise refuse(text, f"the fraction {args} is not within 0..1", "e.g. --edit rope-keep:0.5")
        return RopeKeepEdit(text, fraction)
    if kind == "shift":
        return ShiftEdit(text, _whole(text, args, minimum=0))
    selection, value = _value(text, args)
    return ChannelEdit(text, _pairs(text, selection, star_second=False), value)


_TYPES = (HeadEdit, AttendEdit, BandEdit, RopeKeepEdit, ShiftEdit, ChannelEdit)


def _value(text: str, args: str) -> tuple[str, str]:
    selection, eq, value = args.partition("=")
    value = value.strip().lower() if eq else "zero"
    if value not in ("zero", "mean"):
        raise refuse(text, f"the value '{value}' is neither zero nor mean", "e.g. --edit head:3.1=mean")
    return selection.strip(), value


def _number(text: str, word: str) -> float:
    try:
        value = float(word)
    except ValueError:
        raise refuse(text, f"'{word}' is not a number") from None
    if not math.isfinite(value):
        raise refuse(text, f"'{word}' is not a finite number")
    return value


def _whole(text: str, word: str, minimum: int = 0) -> int:
    word = word.strip()
    if not re.fullmatch(r"[+-]?\d+", word):  # NaN, inf, 1.5, words
        raise refuse(text, f"'{word}' is not a whole number")
    value = int(word)
    if value < minimum:
        raise refuse(text, f"{value} is below {minimum}")
    return value


def _range(text: str, word: str, star: bool) -> list[int | None]:
    """'*' (None), 'a-b' or 'a'."""
    word = word.strip()
    if word == "*":
        if not star:
            raise refuse(text, "'*' is allowed for layers here, not for this index")
        return [ALL]
    low, dash, high = word.partition("-")
    if dash and low.strip():
        a, b = _whole(text, low), _whole(text, high)
        if b < a:
            raise refuse(text, f"the range {word} runs backwards")
        return list(range(a, b + 1))
    return [_whole(text, word)]


def _pairs(text: str, args: str, star_second: bool) -> tuple[tuple[int | None, int | None], ...]:
    """(layer, index) pairs of a comma list of L.X items (an item without a dot continues the previous layer)."""
    out: list[tuple[int | None, int | None]] = []
    layers: list[int | None] | None = None
    for item in args.split(","):
        item = item.strip()
        if not item:
            raise refuse(text, "an empty item in the list")
        if "." in item:
            layer, _, index = item.partition(".")
            layers = _range(text, layer, star=True)
        elif layers is None:
            raise refuse(text, f"'{item}' names no layer: write L.X (e.g. 3.1)")
        else:
            index = item
        for layer in layers:
            for x in _range(text, index, star=star_second):
                if (layer, x) not in out:
                    out.append((layer, x))
    return tuple(out)


# ---- checked against a config, before any weight is read


@dataclass(frozen=True)
class EditModel:
    """What checking and applying edits needs to know about a model, read from its config: `layers` L, `heads` H,
    `head_dim` d_h, `hidden` d, `attention_layers` (the layers with softmax attention), `others` (a hybrid's other
    layers and what they are), `kind` (position kind), `rotated` (rotated dims per head, 0 without rotary),
    `layout` (rotary pairing), `causal`, `interface` (attention through AttentionInterface), `max_positions` (a
    learned table's rows, else None), `offset` (a learned table's first position row)."""

    name: str
    layers: int
    heads: int
    head_dim: int
    hidden: int
    attention_layers: tuple[int, ...]
    others: str
    kind: str
    rotated: int
    layout: str
    causal: bool
    interface: bool
    max_positions: int | None
    offset: int

    @property
    def pairs(self) -> int:
        return self.rotated // 2


def edit_model(config: dict, name: str) -> EditModel:
    """The `EditModel` of a config (a multimodal wrapper read as its language model)."""
    from posprobe.architectures import table as T
    from posprobe.architectures.config import config_shape

    config = T.language_model_config(config)
    model_type = str(config.get("model_type", "unknown"))
    family = T.family_for_type(model_type)
    if family is None:
        raise ArgumentValueError("edit", f"{{arg}}: posprobe does not know '{model_type}', so it cannot edit it",
                                 "use a family posprobe lists (posprobe families)")  # fmt: skip
    shape = config_shape(config, name, family)
    types = config.get(family.tensors.get("layer_types", "layer_types")) if not family.hybrid_layers else None
    if family.hybrid_layers:
        cross = set(config.get(family.hybrid_layers) or [])
        types = ["cross_attention" if i in cross else "full_attention" for i in range(shape.layers)]
    if isinstance(types, list) and len(types) == shape.layers:
        attention = tuple(i for i, t in enumerate(types) if t in T.ATTENTION_LAYER_TYPES)
    else:
        attention = tuple(range(shape.layers))
    kind = T.position_kind(config)[0]
    rotated = 0
    if kind == T.ROTARY:
        params = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
        factor = config.get("partial_rotary_factor", params.get("partial_rotary_factor"))
        if factor is None and params and all(isinstance(v, dict) for v in params.values()):
            factor = next((v.get("partial_rotary_factor") for v in params.values() if v.get("partial_rotary_factor")),
                          None)  # fmt: skip
        rotated = int(shape.head_dim * float(factor if factor is not None else 1.0))
        rotated -= rotated % 2
    causal = T.is_causal(family, config)
    table = T.has_learned_table(config) or kind in T.TABLE_KINDS
    return EditModel(
        name=name,
        layers=shape.layers,
        heads=shape.heads,
        head_dim=shape.head_dim,
        hidden=shape.hidden,
        attention_layers=attention,
        others=family.hybrid,
        kind=kind,
        rotated=rotated if family.qkv != T.LATENT else 0,
        layout=T.rotary_layout(family, config),
        causal=causal,
        interface=family.capture == T.INTERFACE,
        max_positions=shape.max_positions if table else None,
        offset=family.position_offset,
    )


_PAIRINGS_EDITABLE = ("rotate-half", "interleaved", "half-interleaved", "reversed")


def check_edits(edits: Sequence[Edit], model: EditModel, longest: int | None = None) -> None:
    """Refuse, in one line each, edits that cannot apply to `model` (`longest`: the most tokens a forward pass will
    hold, for `shift` on a learned table)."""
    from posprobe.architectures import table as T

    kinds = [type(e) for e in edits]
    for edit in edits:
        uses_kernel = isinstance(edit, (HeadEdit, AttendEdit, BandEdit))
        if uses_kernel and not model.interface:
            raise refuse(edit.text, f"'{model.name}' computes attention in its own code, outside transformers' "
                         "AttentionInterface, so posprobe cannot edit its attention",
                         "use channel or shift edits on it, or a family such as Llama, Qwen or GPT-2")  # fmt: skip
        if isinstance(edit, HeadEdit) and edit.select is None:
            for layer, head in edit.heads:
                _check_layer(edit.text, layer, model, attention=True)
                if head is not None and head >= model.heads:
                    raise refuse(edit.text, f"head {head} is out of range: '{model.name}' has {model.heads} heads "
                                 f"per layer (0-{model.heads - 1})")  # fmt: skip
        if isinstance(edit, (BandEdit, RopeKeepEdit)):
            if model.kind != T.ROTARY or model.pairs == 0:
                raise refuse(edit.text, f"'{model.name}' has no rotary embeddings ({model.kind} positions) to edit",
                             "band and rope-keep edit rotary pairs: use a RoPE model (Llama, Qwen, ...)")  # fmt: skip
            if model.layout not in _PAIRINGS_EDITABLE:
                raise refuse(edit.text, f"posprobe cannot edit the rotary pairs of '{model.name}' ({model.layout})",
                             "band and rope-keep apply to rotate-half and interleaved pairings")  # fmt: skip
        if isinstance(edit, BandEdit):
            for layer, pair in edit.pairs:
                _check_layer(edit.text, layer, model, attention=True)
                if pair >= model.pairs:
                    raise refuse(edit.text, f"pair {pair} is out of range: '{model.name}' rotates {model.pairs} "
                                 f"pairs per head (0-{model.pairs - 1})")  # fmt: skip
        if isinstance(edit, ChannelEdit):
            for layer, channel in edit.channels:
                _check_layer(edit.text, layer, model, attention=False)
                if channel >= model.hidden:
                    raise refuse(edit.text, f"channel {channel} is out of range: '{model.name}' has hidden size "
                                 f"{model.hidden} (0-{model.hidden - 1})")  # fmt: skip
        if isinstance(edit, ShiftEdit):
            if model.kind not in (T.ROTARY, T.LEARNED, T.SINUSOIDAL):
                raise refuse(edit.text, f"'{model.name}' uses {model.kind} positions, which read no position ids: a "
                             "shift changes nothing", "shift applies to rotary and absolute-table models")  # fmt: skip
            if model.max_positions is not None and longest is not None:
                longest = min(longest, model.max_positions)  # no run is longer than the table
                end = longest + edit.offset + model.offset
                if end > model.max_positions + model.offset:
                    raise refuse(edit.text, f"positions up to {longest + edit.offset - 1} would index '{model.name}''s "
                                 f"learned table of {model.max_positions} positions past its end",
                                 f"use a shift of at most {max(0, model.max_positions - longest)}")  # fmt: skip
    if kinds.count(AttendEdit) > 1:
        raise refuse(edits[kinds.index(AttendEdit)].text, "give one attend edit per run")
    if kinds.count(ShiftEdit) > 1 or kinds.count(RopeKeepEdit) > 1:
        twice = ShiftEdit if kinds.count(ShiftEdit) > 1 else RopeKeepEdit
        raise refuse(edits[kinds.index(twice)].text, "give this kind once per run")


def _check_layer(text: str, layer: int | None, model: EditModel, attention: bool) -> None:
    if layer is None:
        return
    if layer >= model.layers:
        raise refuse(text, f"layer {layer} is out of range: '{model.name}' has {model.layers} layers "
                     f"(0-{model.layers - 1})")  # fmt: skip
    if attention and layer not in model.attention_layers:
        others = [i for i in range(model.layers) if i not in model.attention_layers]
        raise refuse(text, f"layer {layer} of '{model.name}' has no softmax attention: layers "
                     f"{_spans(others)} are {model.others or 'other layers'}",
                     f"edit its attention layers: {_spans(list(model.attention_layers))}")  # fmt: skip


def _spans(values: list[int]) -> str:
    out, start = [], None
    for k, v in enumerate(values):
        if start is None:
            start = v
        if k + 1 == len(values) or values[k + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ",".join(out)


def edit_layers(selection: int | None, model: EditModel, attention: bool) -> list[int]:
    """The layers a selection names ('*': every attention layer, or every layer)."""
    if selection is not None:
        return [selection]
    return list(model.attention_layers) if attention else list(range(model.layers))


def needs_means(edits: Sequence[Edit]) -> bool:
    """True when an edit sets something to its mean over the run (a first pass collects it, SPEC §20)."""
    return any(isinstance(e, (HeadEdit, ChannelEdit)) and e.value == "mean" for e in edits)


def describe(edits: Sequence[Edit]) -> list[str]:
    """The edits as written (for `--json` and `.npz` metadata)."""
    return [e.text for e in edits]
