"""The sections of `posprobe report`: a registry, one small function per section.

A section names the posprobe command it runs (its arguments, from the model's facts), says in one line why it does
not apply to a model (or None), and turns the command's own `--json` record into what the page shows (`View`):
headline numbers, a key table, the figures the command wrote, and notes. Nothing here computes a position
statistic: every number shown is read from, or is a plain mean / count over, the command's record, so the page
agrees with the command by construction (tests/test_report.py checks it against the records).

A new section is one decorated function (see `context` and `needle` at the end):

    @section("needle", "Needle in a haystack", how_to_read="...", reason=_needs_causal,
             args=lambda facts, n_texts: ["--lengths", "256,512"])
    def needle(record: dict, facts: ModelFacts) -> View:
        return View([headline("accuracy", record["overall_accuracy"])], Table(...), figures=[...])

`args(facts, n_texts) -> list[str]`: the command's arguments after the model (default none); `uses_text=True` adds
the report's `--text`, `--column`, `--max-texts`; `command=` when the section's name is not the command's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from posprobe.pipelines.defaults import MIN_TEXTS


@dataclass(frozen=True)
class ModelFacts:
    """What decides which sections apply, read from the checkpoint's config (cheap: no weights)."""

    label: str
    model_type: str
    kind: (
        str  # posprobe.architectures.table KINDS: learned, sinusoidal, rotary, bucket-bias, alibi, disentangled, other
    )
    mechanism: str  # the kind in words
    causal: bool
    has_table: bool  # an absolute position table E_P exists (learned or sinusoidal)
    n_layers: int | None
    max_positions: int | None = None  # trained positions from the config (max_position_embeddings, n_positions)
    # where rotary bands cannot read every layer together (head shapes or rotated widths that differ: Laguna,
    # MiMo-V2-Flash), the layers of layer 0's shape and width, which the rotary section reads; else None
    rotary_layers: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Headline:
    """One headline number: `value` is what the record holds (None: undefined), `text` how the page prints it;
    `reference` what to read it against (a number: chance, construction or a baseline; or a short text saying why
    there is none) and `reference_text` how the page prints that, with what it is. Every headline has one."""

    label: str
    value: float | int | str | None
    text: str
    reference: float | int | str | None
    reference_text: str


@dataclass(frozen=True)
class Table:
    """A key table: `columns` names, `rows` of already formatted cells."""

    columns: Sequence[str]
    rows: Sequence[Sequence[str]]


@dataclass(frozen=True)
class View:
    """What a section shows from its record."""

    headline: list[Headline]
    table: Table | None
    figures: list[str]  # paths of the PNG files the command wrote, embedded in this order
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    command: str  # the posprobe command it runs
    how_to_read: str
    uses_text: bool
    args: Callable[[ModelFacts, int], list[str]]  # (facts, number of texts the text sections read) -> arguments
    reason: Callable[[ModelFacts], str | None]  # why it does not apply; None when it does
    view: Callable[[dict, ModelFacts], View]


SECTIONS: dict[str, Section] = {}


def section(
    name: str,
    title: str,
    *,
    how_to_read: str,
    command: str | None = None,
    uses_text: bool = False,
    args: Callable[[ModelFacts, int], list[str]] = lambda facts, n_texts: [],
    reason: Callable[[ModelFacts], str | None] = lambda facts: None,
) -> Callable:
    """Register the decorated `view(record, facts) -> View` as section `name` (page order = registration order)."""

    def register(view: Callable[[dict, ModelFacts], View]) -> Callable[[dict, ModelFacts], View]:
        SECTIONS[name] = Section(name, title, command or name, " ".join(how_to_read.split()), uses_text, args, reason,
                                 view)  # fmt: skip
        return view

    return register


# ---------------------------------------------------------------------------------------------------------------
# formatting and reasons shared by sections


def number(value, digits: int = 3) -> str:
    """A record's number as the page prints it: `digits` decimals; None or NaN (undefined) as '—'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"{value:.{digits}f}"


def mean_defined(values) -> float | None:
    """The mean of the values that are defined (not None/NaN); None when none is."""
    kept = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(kept) / len(kept) if kept else None


def _layer_value(value):
    """A layer's reference: the value, or the mean of a list kept per head (a layer whose heads pick keys of their
    own)."""
    return mean_defined(value) if isinstance(value, list) else value


def headline(label: str, value, reference, what: str, digits: int = 3) -> Headline:
    """A headline number with its reference: `reference` a number (printed with the same digits, then `what` says
    what it is) or a short text saying why there is none (then `what` may add to it)."""
    if isinstance(reference, str):
        text = reference + (f" ({what})" if what else "")
    else:
        text = f"{number(reference, digits)} ({what})" if what else number(reference, digits)
    return Headline(label, value, number(value, digits), reference, text)


def _unknown_kind(facts: ModelFacts) -> str | None:
    if facts.kind == "other":
        return f"posprobe has no positional scores for this model: {facts.mechanism}"
    return None


def _needs_table(facts: ModelFacts) -> str | None:
    if not facts.has_table:
        return (
            f"no absolute position table ({facts.mechanism}): there is no P = E_P E_Pᵀ to measure; "
            "F̂_P and the profiles below show its positional scores"
        )
    return None


def _needs_rotary(facts: ModelFacts) -> str | None:
    if facts.kind != "rotary":
        return f"not a rotary model ({facts.mechanism}): it has no rotary frequency bands"
    return None


def _profile_layers(facts: ModelFacts, n_texts: int) -> list[str]:
    """Every layer for up to 12 layers; else the first, middle and last (the profiles of SmolLM2's 30 layers take
    two minutes on two CPU cores, its first, middle and last 27 s)."""
    n = facts.n_layers
    if n is None or n <= 12:
        return ["--layers", "all"]
    return ["--layers", ",".join(str(i) for i in sorted({0, n // 2, n - 1}))]


def _rotary_layers(facts: ModelFacts, n_texts: int) -> list[str]:
    """`_profile_layers`, or where rotary bands read layers of one shape and width only (`facts.rotary_layers`),
    those of layer 0 (every one up to 12, else the first, middle and last of them)."""
    group = facts.rotary_layers
    if not group:
        return _profile_layers(facts, n_texts)
    chosen = group if len(group) <= 12 else sorted({group[0], group[len(group) // 2], group[-1]})
    return ["--layers", ",".join(str(i) for i in chosen)]


def _first_and_last(paths: Sequence[str]) -> list[str]:
    return list(paths[:1]) + (list(paths[-1:]) if len(paths) > 1 else [])


def _peaks_view(record: dict, facts: ModelFacts, what: str) -> View:
    """Profiles (weights or texts): per layer and head the peak offset k ('edge' where the peak is the outermost
    offset the layer covers: the profile rises to where the offsets stop), how many heads peak at k = 0, and the
    reading built on the heads that peak inside (issue 49: a table of edge values read as a finding)."""
    heads = record["heads"]
    edge = [bool(h.get("peak_at_edge")) for h in heads]
    peaks = [h["peak_offset"] for h in heads]
    defined = [p for p in peaks if p is not None]
    inside = [p for p, at_edge in zip(peaks, edge) if p is not None and not at_edge]
    at_zero = sum(1 for p in defined if p == 0)
    n_heads = record["n_heads"]
    rows = []
    for layer in record["layers"]:
        cells = ["—" if h["peak_offset"] is None else "edge" if h.get("peak_at_edge") else f"{int(h['peak_offset']):+d}"
                 for h in heads if h["layer"] == layer]  # fmt: skip
        rows.append([str(layer), *cells])
    table = Table(["layer", *[f"h{h}" for h in range(n_heads)]], rows)
    window = record["window"]
    side = f"−{window} ≤ k ≤ 0 (causal: k > 0 is never used)" if record["causal"] else f"|k| ≤ {window}"
    flat = len(peaks) - len(defined)
    value = f"{at_zero} / {len(defined)}" if defined else "none (all flat)"
    why = "none: a count of heads (a peak at k = 0 is a self-attending head; −1 a previous-token head)"
    notes = [f"peak offset k = j − i of each head's {what} profile, within {side}; — = flat up to round-off"]
    if sum(edge):
        ends = ", ".join(f"±{k}" for k in sorted({abs(p) for p, e in zip(peaks, edge) if e and p is not None}))
        notes.append(
            f"edge: {sum(edge)} of {len(defined)} heads peak at the outermost offset they cover ({ends}): their "
            "profiles rise to where the offsets stop (the table's or the longest text's end), which is no peak "
            "inside and not read as one"
        )
    if inside:
        counts = sorted(((inside.count(k), k) for k in set(inside)), key=lambda c: (-c[0], abs(c[1])))
        common = ", ".join(f"k = {k:+d} ({n} head{'s' if n != 1 else ''})" for n, k in counts[:4])
        notes.append(f"{len(inside)} heads peak inside; most often at {common}")
    elif defined:
        notes.append("no head peaks inside: every defined peak is at the edge of the offsets")
    if flat:
        notes.append(f"{flat} of {len(peaks)} profiles are flat (no peak)")
    if record.get("toeplitz_by_construction"):
        notes.append("Toeplitz by construction here: the scores depend on k alone, whatever the weights")
    return View([Headline(f"heads peaking at k = 0 ({what})", value, value, why, why)], table,
                _first_and_last(record["figures"]), notes)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# the sections, in page order


@section(
    "toeplitz",
    "Position table: Toeplitz R² of P = E_P E_Pᵀ",
    reason=_needs_table,
    how_to_read="""P holds the inner products of the absolute position vectors. An R² near 1 says the table encodes
    relative position (each entry depends on j − i alone); a low R² says the learned positions are not
    translation-invariant. This is measured: nothing makes a learned table Toeplitz by construction (a sinusoidal
    table is close to Toeplitz by its formula).""",
)
def toeplitz(record: dict, facts: ModelFacts) -> View:
    blocks = record.get("blocks") or {}
    columns = ["positions", "R² whole", *[f"R² first {b}" for b in blocks]]
    rows = [[str(record["n_positions"]), number(record["toeplitz_r2"]), *[number(v) for v in blocks.values()]]]
    notes = [f"{record['dropped_rows']} reserved leading rows dropped"] if record.get("dropped_rows") else []
    line = headline("Toeplitz R² of P", record["toeplitz_r2"],
                    "no null: 1 is a table of relative position alone, and a learned table is not Toeplitz by "
                    "construction", "")  # fmt: skip
    return View([line], Table(columns, rows), [record["figure"]], notes)


@section(
    "fhat",
    "Positional scores of layer 0: F̂_P per head",
    reason=_unknown_kind,
    how_to_read="""F̂_P is what position alone adds to each head's attention scores (SPEC §3; for a model without a
    table, the scores of a sequence of the average word, SPEC §9). A head whose F̂_P has Toeplitz R² near 1 scores
    by relative offset; a low R² means absolute positions matter. For rotary, ALiBi and relative-bias models the R²
    is 1 by construction and is not shown: read the profiles instead.""",
)
def fhat(record: dict, facts: ModelFacts) -> View:
    by_construction = record["toeplitz_by_construction"]
    rows = [
        [str(h["head"]), "by construction" if by_construction else number(h["toeplitz_r2"])] for h in record["heads"]
    ]
    label = "mean F̂_P Toeplitz R², layer 0"
    value = (
        Headline(label, None, "by construction", 1.0, "1 by construction (the scores depend on j − i alone)")
        if by_construction
        else headline(label, record["mean_toeplitz_r2"], "no null: 1 is scoring by relative offset alone", "")
    )
    notes = ["causal: only k ≤ 0 is ever used"] if record["causal"] else []
    if by_construction:  # no per-head number to show: every head's R² is 1 whatever the weights
        notes.append("Toeplitz by construction: the scores depend on k = j − i alone, so no head has an R² to show")
    return View([value], None if by_construction else Table(["head", "Toeplitz R²"], rows), [record["figure"]], notes)


@section(
    "profiles",
    "Head profiles over k = j − i (from the weights)",
    reason=_unknown_kind,
    args=_profile_layers,
    how_to_read="""Each head's positional score against the offset k = j − i (diagonal means of F̂_P). A peak at
    k = −1 or +1 is a previous- or next-token head, a peak at 0 a self-attending head, a flat profile a head that
    ignores position. Causal models only use k ≤ 0. Figures: the first and last layer computed.""",
)
def profiles(record: dict, facts: ModelFacts) -> View:
    return _peaks_view(record, facts, "weights")


@section(
    "fit-tisa",
    "TISA kernels fitted to the profiles",
    reason=_unknown_kind,
    args=_profile_layers,
    how_to_read="""Five Gaussian kernels per head, f(k) = Σ a·exp(−|b|(k−c)²), fitted to each profile within the
    window. A high held-out R² (offsets just beyond the window) says the profiles really are smooth functions of k
    that a relative-position mechanism (TISA) could carry; the in-window R² alone is high almost by construction
    (16 parameters for 33 points).""",
)
def fit_tisa(record: dict, facts: ModelFacts) -> View:
    heads = record["heads"]
    rows = []
    for layer in record["layers"]:
        mine = [h for h in heads if h["layer"] == layer]
        r2 = [h["r2"] for h in mine if h["r2"] is not None]
        lowest = min(r2) if r2 else None
        rows.append([str(layer), number(_median(r2)), number(lowest), number(_median([h["holdout_r2"] for h in mine]))])
    table = Table(["layer", "median R²", "min R²", "median held-out R²"], rows)
    points, parameters = record.get("points"), record.get("parameters")
    fit_why = (
        f"none: high almost by construction ({parameters} parameters for {points} points)"
        if points and parameters
        else "none: high almost by construction (a fit in the window it was fitted to)"
    )
    lines = [
        headline(f"TISA fit median R² (S = {record['kernels']})", record["median_r2"], fit_why, ""),
        headline(
            "TISA held-out median R²", record["median_holdout_r2"], 0.0, "predicting the held-out offsets by their mean"
        ),  # fmt: skip
    ]
    notes = list(record.get("warnings") or [])
    return View(lines, table, [record["figure"]], notes)


def _median(values) -> float | None:
    kept = sorted(float(v) for v in values if v is not None and not math.isnan(float(v)))
    if not kept:
        return None
    mid = len(kept) // 2
    return kept[mid] if len(kept) % 2 else (kept[mid - 1] + kept[mid]) / 2


@section(
    "rotary",
    "Rotary frequency bands",
    reason=_needs_rotary,
    args=_rotary_layers,
    how_to_read="""The share of each head's query and key norm in each rotary band, against the band's wavelength.
    Norm in bands longer than the context (they barely rotate within it) means the head uses those dimensions for
    content, not position; 'equal' is that share if every band had the same norm, the baseline to compare with.
    The rotary budget, where shown, follows from the config alone (theta, dims, trained length): by construction.""",
)
def rotary(record: dict, facts: ModelFacts) -> View:
    summary = record["summary"]
    rows = [
        [str(r["layer"]), number(r["q_long_band_share"], 2), number(r["k_long_band_share"], 2),
         number(r["long_band_fraction"], 2), number(r["q_peak_wavelength"], 0), number(r["k_peak_wavelength"], 0)]
        for r in summary
    ]  # fmt: skip
    table = Table(["layer", "q long", "k long", "equal", "q peak λ", "k peak λ"], rows)
    lines = [
        headline("query norm in bands longer than the context (mean over layers)",
                 mean_defined(r["q_long_band_share"] for r in summary),
                 mean_defined(r["long_band_fraction"] for r in summary), "equal band norms", 2),
    ]  # fmt: skip
    notes = [f"context: {record['context']} tokens; λ in tokens"]
    if facts.rotary_layers:
        notes.append(
            "the layers of layer 0's head shape and rotated width: the model's other layers have others, read with "
            "`posprobe rotary --layers`"
        )
    budget = record.get("budget")  # the rotary budget (SPEC §17), where the rotary module is built from rope parameters
    if budget:
        lines.append(headline("rotary budget: extrapolation limit (tokens)", budget["extrapolation_limit"],
                              budget["trained_length"], "the trained length", 0))  # fmt: skip
        notes.append(
            f"rotary budget (Liu et al. 2023): critical dimension {budget['critical_dimension']} of "
            f"{budget['rotated_dims']} rotated dims ({budget['pairs_with_full_period']} of {budget['pairs']} pairs "
            f"turn a full period within the trained {budget['trained_length']} tokens; rope theta "
            f"{budget['rope_theta']:g})"
        )
    return View(lines, table, [record["figure"]], notes)


@section(
    "attention",
    "Attention on real text: distances and sinks",
    uses_text=True,
    how_to_read="""Measured on the texts: each head's mean attention distance |j − i| (against what uniform
    attention would give) and the attention sinks, the mass on the first token. A head far below the uniform
    distance is local; a sink rate near 1 says most heads park their attention on the first token (a known
    property of trained models, not of the texts).""",
)
def attention(record: dict, facts: ModelFacts) -> View:
    rows = []
    for li, layer in enumerate(record["layers"]):
        rows.append([
            str(layer),
            number(mean_defined(record["mean_distance"][li]), 2),
            number(_layer_value(record["uniform_distance"][li]), 2),
            number(mean_defined(record["first_token_mass"][li])),
            number(record["sink_rate"][li], 2),
            number(mean_defined(record["toeplitz_r2"][li])),
        ])  # fmt: skip
    table = Table(["layer", "mean distance", "uniform", "first-token mass", "sink rate", "score Toeplitz R²"], rows)
    last = len(record["layers"]) - 1
    uniform_mass = mean_defined(_layer_value(v) for v in record["uniform_first_token_mass"])
    threshold = record.get("sink_threshold")
    uniform_rate = None if uniform_mass is None or threshold is None else float(uniform_mass >= threshold)
    lines = [
        headline("sink rate (mean over layers)", mean_defined(record["sink_rate"]), uniform_rate,
                 f"uniform attention: its first-token mass {number(uniform_mass)} against the sink threshold "
                 f"{number(threshold, 2)}", 2),
        headline("first-token mass (mean over layers and heads)",
                 mean_defined(mean_defined(row) for row in record["first_token_mass"]), uniform_mass,
                 "uniform attention over the keys each query sees"),
        headline("mean attention distance, last layer", mean_defined(record["mean_distance"][last]),
                 _layer_value(record["uniform_distance"][last]), "uniform attention over the same keys", 2),
    ]  # fmt: skip
    figures = [f for f in record["figures"] if f.endswith(("sinks.png", "mean_distance.png"))]
    notes = [f"{record['n_texts']} texts ({record['text']}), {record['n_queries']} queries; all means are over heads"]
    return View(lines, table, figures, notes)


@section(
    "profiles-text",
    "Head profiles conditioned on real text",
    command="profiles",
    uses_text=True,
    reason=_unknown_kind,
    args=_profile_layers,
    how_to_read="""The same profiles, with each layer's input the mean hidden state entering it on the texts (SPEC
    §13) instead of the weights alone. Peaks that move from the weights-only profiles show what the layers before
    add. With a learned table and the mean input the scores are constant in k by construction (flat: no peak).""",
)
def profiles_text(record: dict, facts: ModelFacts) -> View:
    view = _peaks_view(record, facts, "text")
    c = record.get("conditioning") or {}
    note = f"input {c.get('input')} over {c.get('n_texts')} texts ({c.get('n_tokens')} tokens)"
    return View(view.headline, view.table, view.figures, [note, *view.notes, *([c["note"]] if c.get("note") else [])])


@section(
    "states",
    "Position in the hidden states",
    uses_text=True,
    args=lambda facts, n_texts: ["--min-texts", str(min(MIN_TEXTS, n_texts))],  # the command's default, or fewer
    how_to_read="""For every hidden state (0 = the embedding output): a ridge probe's held-out R² for the token's
    position (beside a permuted-position control, near 0 by construction), the Toeplitz R² of the positional
    vectors' Gram matrix, and the largest activation over its median (a 'massive activation'). Read the probe
    against the no-hidden-state baseline: what the first-token flag (and, where the model attends both ways, the
    text's length) gives with no hidden state; a causal position cannot see the length, so its baseline has only
    the flag. A probe R² that falls with depth says later layers keep less absolute position.""",
)
def states(record: dict, facts: ModelFacts) -> View:
    rows = []
    for s in range(record["n_states"]):
        rows.append([
            str(s),
            number(record["probe_r2"][s]),
            number(record["probe_r2_control"][s]),
            number(record["probe_mae"][s], 2),
            number(record["positional_toeplitz_r2"][s]),
            number(record["massive_ratio"][s], 1),
        ])  # fmt: skip
    table = Table(["state", "probe R²", "control R²", "probe MAE", "Gram Toeplitz R²", "massive ratio"], rows)
    baseline, inputs = record.get("probe_r2_baseline"), baseline_inputs_words(record)
    lines = [
        headline("position probe R², embedding output", record["probe_r2"][0], baseline,
                 f"no hidden state: {inputs}"),
        headline("position probe R², last hidden state", record["probe_r2"][-1], baseline,
                 f"no hidden state: {inputs}"),
    ]  # fmt: skip
    gram, null = (
        record.get("positional_toeplitz_r2_without_first"),
        record.get("positional_toeplitz_r2_without_first_null_mean"),
    )
    if gram and null:
        spread = (record.get("positional_toeplitz_r2_without_first_null_std") or [None])[-1]
        lines.append(headline("positional Gram Toeplitz R² over i ≥ 1, last hidden state", gram[-1], null[-1],
                              f"permutation null, mean{'' if spread is None else f' ± {number(spread)}'}"))  # fmt: skip
    within = record.get("positional_positions_within_noise_without_first")
    if within:
        kept = max(int(record["n_positions_kept"]) - 1, 0)
        value = None if within[-1] is None else int(within[-1])
        lines.append(headline("positions i ≥ 1 whose vector is within twice the noise floor, last hidden state",
                              value, kept, "positions kept: all of them within it = sampling alone", 0))  # fmt: skip
    notes = [f"{record['n_texts']} texts ({record['text']}), {record['n_positions_kept']} positions kept"]
    return View(lines, table, list(record["figures"]), notes)


def baseline_inputs_words(record: dict) -> str:
    """What the states record's no-hidden-state baseline used, in words (`baseline_inputs`; an older record's
    `probe_baseline_features`)."""
    from posprobe.analysis.position_probe import baseline_words

    inputs = record.get("baseline_inputs")
    if inputs:
        return baseline_words(inputs)
    return str(record.get("probe_baseline_features") or "first-token flag + text length").split(" (")[0]


def loss_plateau(record: dict, variant: str | None = None, tolerance: float = 0.1) -> int | None:
    """The first position t (a bin start of `loss_by_octave`, t >= 1) from which the loss stops falling: no later
    bin's mean is more than `tolerance` nats below that bin's. None when there are no bins."""
    octaves = record.get("loss_by_octave") or {}
    bins, means = octaves.get("position_bins"), octaves.get(variant or record["variants"][0])
    if not bins or not means:
        return None
    for k in range(1, len(bins)):
        later = [m for m in means[k + 1 :] if m is not None]
        if means[k] is not None and all(m >= means[k] - tolerance for m in later):
            return int(bins[k][0])
    return None


NEEDLE_ROOM = 32  # tokens a needle prompt leaves for its answer within the trained positions


def _long_lengths(facts: ModelFacts, room: int = 0) -> str:
    """Window / prompt lengths for `context` and `needle` that a laptop's CPU runs in a minute or two: 256 and 512
    tokens, within the trained positions less `room` (the needle's answer follows its prompt); for a model trained
    on fewer, half and all of what fits."""
    if facts.max_positions is None or facts.max_positions - room >= 512:
        return "256,512"
    limit = max(facts.max_positions - room, 2)
    return f"{limit // 2},{limit}"


def _interval(pair) -> str:
    """'11.90–12.80', or '—' where there is none (one window, or a record from before issue 49)."""
    if not pair or pair[0] is None or pair[1] is None:
        return "—"
    return f"{number(pair[0], 2)}–{number(pair[1], 2)}"


def _accuracy_cell(accuracy, trials) -> str:
    """'0.67 (0.21–0.94)': a needle cell's accuracy and its Wilson 95 % interval over `trials` prompts."""
    if accuracy is None or not isinstance(trials, int) or trials < 1:
        return number(accuracy, 2)
    from posprobe.analysis.needle import wilson_interval

    low, high = wilson_interval(round(accuracy * trials), trials)
    return f"{number(accuracy, 2)} ({float(low):.2f}–{float(high):.2f})"


def _needs_causal(facts: ModelFacts) -> str | None:
    if not facts.causal:
        return f"not a causal language model ({facts.mechanism}, attends both ways): there is no next-token loss"
    return None


@section(
    "context",
    "Loss by position and perplexity by window length",
    reason=_needs_causal,
    args=lambda facts, n_texts: ["--lengths", _long_lengths(facts), "--windows", "2"],
    how_to_read="""The next-token loss at each position of long windows of the King James Bible, and the perplexity
    per window length (SPEC §17). Loss that keeps falling with position says the model uses the longer context;
    loss that rises past the trained length says its positions do not extrapolate. Perplexity is measured, nothing
    here is by construction.""",
)
def context(record: dict, facts: ModelFacts) -> View:
    variant = record["variants"][0]
    perplexity = record["perplexity"][variant]
    scored = record.get("scored_tokens") or dict(zip(map(str, record["lengths"]), record["tokens"]))
    # one perplexity column per variant (the report's --rope-scaling), a length past the trained one marked *
    names = record["variants"]
    past = set(record.get("beyond_trained_length") or [])
    intervals = (record.get("perplexity_interval") or {}).get(variant) or {}
    rows = [[f"{n}{' *' if n in past else ''}", *[number(record["perplexity"][v][str(n)], 2) for v in names],
             _interval(intervals.get(str(n))), str(scored[str(n)])] for n in record["lengths"]]  # fmt: skip
    columns = ["perplexity"] if len(names) == 1 else [f"perplexity ({v})" for v in names]
    columns.append("95 % interval over windows" + ("" if len(names) == 1 else f" ({variant})"))
    longest, shortest = record["lengths"][-1], record["lengths"][0]
    scaled = "" if variant == "none" else f" ({variant})"  # 'none': the model's own rotary setting, unscaled
    same = len({scored[str(n)] for n in record["lengths"]}) == 1
    lines = [
        headline(f"perplexity at {longest} tokens{scaled}", perplexity[str(longest)],
                 perplexity[str(shortest)] if shortest != longest else "none: one length only",
                 (f"at {shortest} tokens, {'the same' if same else 'other'} tokens scored" if shortest != longest
                  else ""), 2),
    ]  # fmt: skip
    plateau = loss_plateau(record, variant)
    if plateau is not None:
        first = record["loss_by_octave"][variant][0]
        lines.append(Headline("loss stops falling by position t ≈", plateau, str(plateau), first,
                              f"{number(first, 2)} nats at t = 0; from t ≈ {plateau} on, no position bin's loss is "
                              "more than 0.1 nats lower"))  # fmt: skip
    notes = [record["note"]] if record.get("note") else []
    if past:
        notes.append(f"* past the trained length ({record.get('trained_length')} tokens)")
    return View(lines, Table(["window length", *columns, "tokens scored"], rows), list(record["figures"]), notes)


@section(
    "needle",
    "Needle in a haystack: retrieval by length and depth",
    reason=_needs_causal,
    args=lambda facts, n_texts: [
        "--lengths",
        _long_lengths(facts, NEEDLE_ROOM),
        "--depths",
        "0,0.5,1",
        "--trials",
        "2",
    ],
    how_to_read="""A random pass key hidden at several depths of a King James haystack, asked for at the end (SPEC
    §18): the share of greedy continuations that are exactly the key, per prompt length and depth. Accuracy that
    drops in the middle depths is the 'lost in the middle' pattern; a drop at one end can be the prompt's format
    (chat models get their tokenizer's chat template unless --no-chat: the note says which); the note names the
    heads whose last-token attention falls most on the needle. Nothing here is by construction: the model has to
    find the key.""",
)
def needle(record: dict, facts: ModelFacts) -> View:
    depths = record["depths"]
    trials = record.get("trials")
    rows = [[str(g["length"]), *[_accuracy_cell(a, trials) for a in g["accuracy"]]] for g in record["grid"]]
    digits = (record.get("task") or {}).get("digits") if isinstance(record.get("task"), dict) else None
    chance = 10.0**-digits if isinstance(digits, int) and not (record.get("task") or {}).get("answer") else None
    lines = [
        headline("needle retrieval accuracy (all prompts)", record["overall_accuracy"],
                 "≈ 0: guessing a random pass key" if chance is None else chance,
                 "" if chance is None else f"guessing a random {digits}-digit pass key", 2),
    ]  # fmt: skip
    figures = [record["files"][name] for name in ("needle_grid", "needle_heads") if name in record["files"]]
    attending = record.get("needle_attending_heads", record.get("top_heads", []))
    heads = ", ".join(f"L{h['layer']}.H{h['head']}" for h in attending[:5])
    notes = (
        [f"{record['n_prompts']} prompts; needle-attending heads (attention on the needle): {heads}"] if heads else []
    )
    copying = ", ".join(f"L{h['layer']}.H{h['head']}" for h in record.get("retrieval_heads", [])[:5])
    if copying:
        notes.append(f"retrieval heads (Wu et al. 2024, copying the answer from the needle): {copying}")
    if isinstance(trials, int):
        notes.append(f"each cell: accuracy over its n = {trials} prompts, with its Wilson 95 % interval")
    chat = (record.get("task") or {}).get("chat") if isinstance(record.get("task"), dict) else None
    if chat is not None:
        notes.append("prompts in the tokenizer's own chat template" if chat else "prompts as plain continuation")
    return View(lines, Table(["length", *[f"depth {d:g}" for d in depths]], rows), figures, notes)
