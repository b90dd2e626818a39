"""`build_report`: run every section that applies to a model, each through its own posprobe command, and write one
self-contained `report.html` (and `report.json`, the summary `--json` prints).

Layout of the output folder `out`::

    out/report.html, out/report.json
    out/<section>/            the command's own `--out` (its figures, arrays and files, as the command writes them)
    out/<section>/section.json   {"argv", "record" (the command's --json object), "seconds"}

Every section runs through the library (`report.library.RUNS`: the pipeline function its command calls, with the
command's defaults (`pipelines.defaults`), `result.save` into out/<section> and the record the command prints with
`--json`, `result.command_record`); no command line is run and no stdout parsed. The record, figures and files are
exactly the command's, and the page shows the command that reproduces them (its arguments are also the reuse key).
The model is loaded once for all sections (`checkpoint.shared`: the commands' own loads, shared while the report
runs). A finished section (its section.json with the same arguments and its figures present) is reused on the next
run unless `force`.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from posprobe.errors import ArgumentValueError, PosprobeError
from posprobe.report.sections import NEEDLE_ROOM, SECTIONS, ModelFacts, Section, View
from posprobe.runtime.phases import phase

DEFAULT_TEXT = "builtin:sentences"
DEFAULT_MAX_TEXTS = 32  # a few dozen: every text section of MiniLM in under a minute on two loaded CPU cores
SECTION_RECORD = "section.json"
CAUSAL_LM_COMMANDS = ("context", "needle")  # the commands that load the model as its causal LM


@dataclass(frozen=True)
class SectionOutcome:
    """One section after the run: status 'ok' (with its record and view), 'not applicable', 'failed' (the command's
    one-line error) or 'left out' (--only / --skip)."""

    section: Section
    status: str
    argv: list[str] | None = None
    record: dict | None = None
    view: View | None = None
    reason: str | None = None
    seconds: float | None = None
    reused: bool = False

    @property
    def command_line(self) -> str | None:
        return None if self.argv is None else shlex.join(["posprobe", *self.argv])

    def summary(self) -> dict:
        out = {"status": self.status, "title": self.section.title, "command": self.command_line}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.view is not None:
            out["headline"] = {h.label: h.value for h in self.view.headline}
            out["reference"] = {h.label: h.reference for h in self.view.headline}
            out["folder"] = self.argv[self.argv.index("--out") + 1]
            out["reused"] = self.reused
            out["seconds"] = self.seconds
        return out


def select_sections(only: list[str] | None, skip: list[str] | None) -> list[str]:
    """The section names to run, in page order; unknown names refused (before any work)."""
    for flag, names in (("only", only), ("skip", skip)):
        if names is not None and not names:
            raise ArgumentValueError(flag, "{arg} is empty", f"name sections, e.g. {{arg}} {next(iter(SECTIONS))}")
        for name in names or []:
            if name not in SECTIONS:
                raise ArgumentValueError(
                    flag, f"unknown section '{name}' in {{arg}}", f"use names from: {', '.join(SECTIONS)}"
                )
    if only and skip:
        raise ArgumentValueError("skip", "{arg} and --only cannot be combined", "pass one of them")
    chosen = [name for name in SECTIONS if (not only or name in only) and name not in (skip or [])]
    return chosen


def model_facts(source) -> ModelFacts:
    """The facts that decide which sections apply, from a resolved checkpoint's config."""
    from posprobe.architectures.table import (
        TABLE_KINDS,
        family_for_type,
        has_learned_table,
        is_causal,
        language_model_config,
        position_kind,
    )

    config = source.config
    kind, mechanism = position_kind(config)
    family = family_for_type(source.model_type)
    causal = is_causal(family, language_model_config(config)) if family is not None else False
    sizes = language_model_config(config)  # a multimodal wrapper: its language model's
    n_layers = _first_int(sizes, ("num_hidden_layers", "n_layer", "num_layers"))
    max_positions = _first_int(sizes, ("max_position_embeddings", "n_positions", "n_ctx"))
    return ModelFacts(source.label, source.model_type, kind, mechanism, causal,
                      kind in TABLE_KINDS or has_learned_table(config), n_layers, max_positions)  # fmt: skip


def _rotary_layers(source) -> tuple[int, ...] | None:
    """Layer 0's group of `pipelines.rotary.rotary_layer_groups` where the model's layers form several, else None
    (also where the model cannot be read: the rotary section then says why itself)."""
    from posprobe.pipelines.rotary import rotary_layer_groups
    from posprobe.pipelines.score_reader import open_model

    try:
        groups = rotary_layer_groups(open_model(source=source))
    except PosprobeError:
        return None
    return tuple(groups[0]) if len(groups) > 1 else None


def _first_int(config: dict, keys: tuple[str, ...]) -> int | None:
    """The first of `keys` whose value in `config` is a whole number."""
    return next((config[k] for k in keys if isinstance(config.get(k), int) and not isinstance(config[k], bool)), None)


def section_call(section: Section, args: list[str], model_args: list[str], text_args: list[str], folder: Path):
    """The `library.SectionCall` of a section: what its reproducing command names (`args`: the section's own
    arguments with the report's options for it, `with_options`), as values."""
    from posprobe.report.library import SectionCall, options_of

    texts = options_of(text_args) if section.uses_text else {}
    return SectionCall(model_args[0], "--allow-pickle" in model_args, options_of(args), folder,
                       texts.get("text"), texts.get("column"), int(texts["max_texts"]) if texts else None)  # fmt: skip


def run_through(section: Section, call) -> dict:
    """A section's record: its command's run through the library (`library.RUNS`) on `call`."""
    from posprobe.report.library import RUNS

    return RUNS[section.command](call)


def _figures_exist(view: View) -> bool:
    return all(Path(f).is_file() for f in view.figures)


def _reusable(folder: Path, argv: list[str], section: Section, facts: ModelFacts):
    """(record, seconds) of a finished earlier run of the same command, or None."""
    path = folder / SECTION_RECORD
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("argv") != argv or not isinstance(saved.get("record"), dict):
        return None
    try:
        view = section.view(saved["record"], facts)
    except (KeyError, TypeError, ValueError, IndexError):
        return None  # written by another posprobe version: run it again
    return (saved["record"], saved.get("seconds"), view) if _figures_exist(view) else None


def run_section(
    section: Section,
    facts: ModelFacts,
    model_args: list[str],
    text_args: list[str],
    n_texts: int,
    out: Path,
    force: bool,
    on_start: Callable[[str], None] = lambda command_line: None,
    options: dict[str, str | None] | None = None,
) -> SectionOutcome:
    """Run (or reuse) one section; a command that refuses the model becomes a 'failed' outcome with its one line
    (what it wrote removed); a full disk is raised, as the whole run's error. `on_start(command line)` is called when
    the command really runs (not when reused)."""
    from posprobe.formats.writing import discard_unkept, disk_full, json_writer, write_files

    reason = section.reason(facts)
    if reason is not None:
        return SectionOutcome(section, "not applicable", reason=reason)
    folder = out / section.name
    args = with_options(section.args(facts, n_texts), options or {})
    argv = [section.command, *model_args, *args, *(text_args if section.uses_text else []),
            "--out", str(folder), "--json"]  # fmt: skip
    if not force:
        reused = _reusable(folder, argv, section, facts)
        if reused is not None:
            record, seconds, view = reused
            return SectionOutcome(section, "ok", argv, record, view, seconds=seconds, reused=True)
    on_start(shlex.join(["posprobe", *argv]))
    start = time.perf_counter()
    try:
        record = run_through(section, section_call(section, args, model_args, text_args, folder))
    except PosprobeError as err:
        discard_unkept()  # the failed command's files and folders (an empty section folder), not the others'
        if disk_full(err):  # an error of the run, not of the section: the previous page stays
            raise
        return SectionOutcome(section, "failed", argv, reason=err.render(cli=True))
    seconds = round(time.perf_counter() - start, 2)
    view = section.view(record, facts)
    write_files(folder, {SECTION_RECORD: json_writer({"argv": argv, "record": record, "seconds": seconds})})
    return SectionOutcome(section, "ok", argv, record, view, seconds=seconds)


def with_options(args: list[str], options: dict[str, str | None]) -> list[str]:
    """A section's arguments with the report's own options for it: each flag's value replaced where the section
    passes the flag, else the flag added (a value of '' adds a flag that takes none; None leaves the flag out)."""
    args = list(args)
    for flag, value in options.items():
        if value is None:
            continue
        if flag in args and value != "":
            args[args.index(flag) + 1] = value
        elif flag not in args:
            args += [flag] if value == "" else [flag, value]
    return args


def long_context_options(
    facts: ModelFacts, lengths: list[int] | None, rope_scaling: str | None, device: str | None
) -> dict[str, dict[str, str | None]]:
    """The report's --lengths, --rope-scaling and --device for its `context` and `needle` sections (issue 49): the
    lengths for both (the needle's prompts past the trained positions less its answer's room allowed, and said so
    by the command), the scaling variants for `context` (needle runs the model as it is), the device for both."""
    joined = None if lengths is None else ",".join(map(str, lengths))
    past = lengths is not None and facts.max_positions is not None and lengths[-1] + NEEDLE_ROOM > facts.max_positions
    return {
        "context": {"--lengths": joined, "--rope-scaling": rope_scaling, "--device": device},
        "needle": {"--lengths": joined, "--device": device, "--beyond-window": "" if past else None},
    }


def build_report(
    model: str | None = None,
    *,
    text: str | None = None,
    column: str | None = None,
    max_texts: int | None = None,
    out: str | Path | None = None,
    only: list[str] | None = None,
    skip: list[str] | None = None,
    force: bool = False,
    allow_pickle: bool = False,
    progress: Callable[[str], None] | None = None,
    lengths: str | Sequence[int] | None = None,
    rope_scaling: str | None = None,
    device: str | None = None,
) -> dict:
    """Run the sections that apply to `model` and write `report.html` into `out` (default
    `posprobe-out/report/<model>`). Returns the summary written to `report.json`: `html`, `model`, `headline` (list of
    {section, label, value, text}) and `sections` (name -> status, command, headline or reason).

    Every argument is checked, and the texts read once, before any model is run. `text` defaults to the packaged
    `builtin:sentences`, `max_texts` to 32. `lengths`, `rope_scaling`, `device`: as for `context` (the lengths and
    device also for `needle`); default the sections' own (256 and 512 tokens within the trained positions, the
    model unscaled, cuda where available)."""
    from posprobe.capture.textrun import check_run_settings
    from posprobe.checkpoint import resolve_model
    from posprobe.checkpoint.shared import shared_loads
    from posprobe.families.rope_variants import parse_variants
    from posprobe.formats.writing import default_out, keep_written, prepare_out_dir
    from posprobe.pipelines.context import check_lengths
    from posprobe.texts.reading import check_texts
    from posprobe.validation import as_int

    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    phase("checking the arguments, the texts and the model")  # seconds before the first section (on a terminal)
    chosen = select_sections(only, skip)
    max_texts = DEFAULT_MAX_TEXTS if max_texts is None else as_int(max_texts, "max_texts", minimum=1)
    if text is None and column is not None:
        raise ArgumentValueError("column", "{arg} applies only with --text", "pass --text FILE, or drop {arg}")
    text = DEFAULT_TEXT if text is None else str(text)
    length_list = None if lengths is None else check_lengths(lengths)
    if rope_scaling is not None:
        parse_variants(rope_scaling)
    check_run_settings(device=device)
    wants_text = any(SECTIONS[name].uses_text for name in chosen)
    n_texts = check_texts(text, column, max_texts) if wants_text else 0
    source = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=wants_text)
    facts = model_facts(source)
    options = long_context_options(facts, length_list, rope_scaling, device)
    out_dir = prepare_out_dir(out if out is not None else default_out("report", source.label))
    # the model always named (the packaged default by its name), so that every reproducing command says which
    model_args = [source.name] + (["--allow-pickle"] if allow_pickle else [])
    text_args = ["--text", text, *(["--column", column] if column else []), "--max-texts", str(max_texts)]

    outcomes = []
    # the model is loaded (and a GGUF file de-quantised) once, by the first section that needs it, and handed to
    # the others (`checkpoint.shared`); as the causal LM when a causal section will run, whose base model the
    # text sections read
    causal = facts.causal and any(SECTIONS[name].command in CAUSAL_LM_COMMANDS for name in chosen)
    with shared_loads(causal=causal):
        if facts.kind == "rotary":  # from the weights, through the reader the sections share
            phase("reading the rotary layers' widths from the weights")
            facts = replace(facts, rotary_layers=_rotary_layers(source))
        for i, name in enumerate(SECTIONS, start=1):
            section = SECTIONS[name]
            if name not in chosen:
                outcomes.append(SectionOutcome(section, "left out", reason="left out by --only / --skip"))
                continue
            step = f"[{i}/{len(SECTIONS)}] {name}"
            outcome = run_section(section, facts, model_args, text_args, n_texts, out_dir, force,
                                  on_start=lambda line, step=step: say(f"{step}: {line} …"),
                                  options=options.get(name))  # fmt: skip
            say(f"{step}: {_outcome_words(outcome)}")
            keep_written()  # a later failure or Ctrl-C keeps the finished sections, for the next run to reuse
            outcomes.append(outcome)
    return write_report(out_dir, facts, outcomes, text if wants_text else None)


def _outcome_words(outcome: SectionOutcome) -> str:
    if outcome.status != "ok":
        return f"{outcome.status} — {outcome.reason}"
    return "reused (--force runs it again)" if outcome.reused else f"done in {outcome.seconds:.1f} s"


def write_report(out_dir: Path, facts: ModelFacts, outcomes: list[SectionOutcome], text: str | None) -> dict:
    """Write report.html and report.json into `out_dir` (together, atomically); the summary dict."""
    from posprobe.formats.writing import json_writer, write_files
    from posprobe.report.page import render_page
    from posprobe.report.story import story

    html_path = out_dir / "report.html"
    claims = story(facts, {o.section.name: o.record for o in outcomes if o.view is not None and o.record is not None},
                   {o.section.name: o.status for o in outcomes})  # fmt: skip
    summary = {
        "html": str(html_path),
        "model": facts.label,
        "model_type": facts.model_type,
        "position_kind": facts.kind,
        "causal": facts.causal,
        "text": text,
        "story": [claim.to_dict() for claim in claims],
        "headline": [
            {
                "section": o.section.name,
                "label": h.label,
                "value": h.value,
                "text": h.text,
                "reference": h.reference,
                "reference_text": h.reference_text,
            }
            for o in outcomes
            if o.view is not None
            for h in o.view.headline
        ],  # fmt: skip
        "sections": {o.section.name: o.summary() for o in outcomes},
    }
    page = render_page(facts, outcomes, text, claims, base=out_dir)
    write_files(
        out_dir,
        {"report.html": lambda p: p.write_text(page, encoding="utf-8"), "report.json": json_writer(summary)},
    )
    return summary
