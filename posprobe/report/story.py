"""The few sentences that open the report's summary: this model's position story, generated from the sections'
records and their references, each claim naming the section it comes from (the page links it there).

Pure: records (the commands' `--json` objects) in, `Claim`s out; nothing is computed that the sections do not
show. The claims, in order, where their section ran: the position table (or that there is none), the rotary
bands against equal norms, where the attention sinks start, whether position is readable from the hidden
states above the no-hidden-state baseline, where the loss stops falling, and where the needle is found.
"""

from __future__ import annotations

from dataclasses import dataclass

from posprobe.report.sections import (
    ModelFacts,
    baseline_inputs_words,
    loss_plateau,
    mean_defined,
    number,
)

SINK_RATE = 0.5  # a layer "has sinks" when at least half its heads park their attention on the first token
FOUND = 0.5  # a depth is "found" when at least half its prompts give the key exactly


@dataclass(frozen=True)
class Claim:
    """One sentence of the summary and the section (its id on the page) it comes from."""

    text: str
    section: str

    def to_dict(self) -> dict:
        return {"text": self.text, "section": self.section}


def story(facts: ModelFacts, records: dict[str, dict], statuses: dict[str, str]) -> list[Claim]:
    """The summary's claims from `records` (section name -> record, for the sections that ran) and `statuses`
    (section name -> status: 'ok', 'not applicable', 'failed', 'left out')."""
    claims = [
        _table(facts, records, statuses),
        _rotary(records),
        _sinks(records),
        _states(records),
        _context(records),
        _needle(records),
    ]
    return [c for c in claims if c is not None]


def _table(facts: ModelFacts, records: dict, statuses: dict) -> Claim | None:
    if statuses.get("toeplitz") == "not applicable":
        return Claim(f"No position table: positions enter through {facts.mechanism}.", "toeplitz")
    record = records.get("toeplitz")
    if record is None:
        return None
    r2 = record.get("toeplitz_r2")
    shape = "close to relative (Toeplitz)" if r2 is not None and r2 >= 0.9 else "not translation-invariant"
    return Claim(f"Its position table of {record['n_positions']} rows is {shape}: Toeplitz R² {number(r2)} "
                 "(1 = relative position alone).", "toeplitz")  # fmt: skip


def _rotary(records: dict) -> Claim | None:
    record = records.get("rotary")
    if record is None:
        return None
    summary = record["summary"]
    share = mean_defined(r["q_long_band_share"] for r in summary)
    equal = mean_defined(r["long_band_fraction"] for r in summary)
    if share is None or equal is None:
        return None
    more = "more" if share > equal else "no more"
    return Claim(f"Rotary bands: {share:.0%} of the query norm sits in bands too slow to turn within the "
                 f"{record['context']}-token context, {more} than the {equal:.0%} equal band norms would give.",
                 "rotary")  # fmt: skip


def _sinks(records: dict) -> Claim | None:
    record = records.get("attention")
    if record is None:
        return None
    rates, layers = record["sink_rate"], record["layers"]
    uniform = mean_defined(mean_defined(v) if isinstance(v, list) else v for v in record["uniform_first_token_mass"])
    start = next((i for i in range(len(rates)) if all(r is not None and r >= SINK_RATE for r in rates[i:])), None)
    against = f"uniform attention's first-token mass is {number(uniform)}"
    if start is None:
        return Claim(f"No attention sinks in the last layer read: fewer than half its heads park their attention "
                     f"on the first token ({against}).", "attention")  # fmt: skip
    where = "in every layer read" if start == 0 else f"from layer {layers[start]} on"
    return Claim(f"Attention sinks {where}: at least half the heads park their attention on the first token "
                 f"({against}).", "attention")  # fmt: skip


def _states(records: dict) -> Claim | None:
    record = records.get("states")
    if record is None:
        return None
    baseline = record.get("probe_r2_baseline")
    probes = [(r, s) for s, r in enumerate(record["probe_r2"]) if r is not None]
    if baseline is None or not probes:
        return None
    best, state = max(probes)
    inputs = baseline_inputs_words(record)
    first = record["probe_r2"][0]
    if best > baseline:
        tail = ""
        if first is not None and first <= baseline:
            tail = f"; the embedding output ({number(first)}) is not above it"
        return Claim(f"Position is readable from the hidden states above the no-hidden-state baseline: probe R² "
                     f"up to {number(best)} (hidden state {state}) against {number(baseline)} from the {inputs} "
                     f"alone{tail}.", "states")  # fmt: skip
    return Claim(f"Position is not readable from the hidden states above the no-hidden-state baseline: probe R² "
                 f"at most {number(best)} against {number(baseline)} from the {inputs} alone.", "states")  # fmt: skip


def _context(records: dict) -> Claim | None:
    record = records.get("context")
    if record is None:
        return None
    variant = record["variants"][0]
    plateau = loss_plateau(record, variant)
    longest = record["lengths"][-1]
    if plateau is None:
        return None
    start = record["loss_by_octave"][variant][0]
    return Claim(f"The next-token loss falls from {number(start, 1)} nats at t = 0 and stops falling by t ≈ "
                 f"{plateau} in windows of {longest} tokens: little is gained from tokens further back.",
                 "context")  # fmt: skip


def _needle(records: dict) -> Claim | None:
    record = records.get("needle")
    if record is None:
        return None
    depths, grid = record["depths"], record["grid"]
    chat = (record.get("task") or {}).get("chat") if isinstance(record.get("task"), dict) else None
    form = {True: " (the tokenizer's chat template)", False: " (plain continuation)"}.get(chat, "")
    per_depth = [mean_defined(g["accuracy"][k] for g in grid) for k in range(len(depths))]
    missed = [d for d, a in zip(depths, per_depth) if a is None or a < FOUND]
    if not missed:
        accuracy = number(record["overall_accuracy"], 2)
        return Claim(f"The needle is found at every depth and length tried (accuracy {accuracy}).", "needle")
    if len(missed) == len(depths):
        return Claim(f"The needle is not found at any depth with this prompt format{form} (accuracy "
                     f"{number(record['overall_accuracy'], 2)}).", "needle")  # fmt: skip
    listed = ", ".join(f"{d:g}" for d in missed)
    return Claim(f"The needle is found except at depth {listed} with this prompt format{form} (accuracy below "
                 f"{FOUND:g} there; {number(record['overall_accuracy'], 2)} over all prompts).", "needle")  # fmt: skip
