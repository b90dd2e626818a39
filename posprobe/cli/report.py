"""Command `report`: every analysis that applies to a model on one self-contained page (`report.html`).

`report --json` prints one object: `html` (the page), `model`, `model_type`, `position_kind`, `causal`, `text`,
`story` (list of {`text`, `section`}: the sentences that open the page's summary, generated from the numbers and
their references, each naming the section it links to), `headline` (list of {`section`, `label`, `value`, `text`,
`reference`, `reference_text`}: the page's summary numbers, each read from its command's record; `text` as the page
prints it; `reference` what to read it against: a number, or a short text saying why there is none;
`reference_text` as the page prints it) and `sections` (name -> `status` ('ok', 'not applicable', 'failed', 'left
out'), `title`, `command` (the command that reproduces it), and `headline`, `reference`, `folder`, `reused`,
`seconds` when it ran, or `reason`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json, log_console
from posprobe.cli.options import (
    AllowPickleOpt,
    ColumnOpt,
    DeviceOpt,
    JsonOpt,
    ModelArg,
    OutOpt,
)
from posprobe.report.sections import SECTIONS  # the registry only: no torch, no matplotlib

_NAMES = ", ".join(SECTIONS)


def register(app: typer.Typer) -> None:
    app.command("report", short_help="Everything posprobe knows about a model's position, on one offline page.")(report)


def report(
    model: ModelArg = None,
    text: Annotated[
        str | None,
        typer.Option("--text", help="Texts for the text sections (as for `attention`); default builtin:sentences."),
    ] = None,
    column: ColumnOpt = None,
    max_texts: Annotated[
        int | None, typer.Option("--max-texts", help="Use at most this many texts (default 32).")
    ] = None,
    only: Annotated[
        str | None, typer.Option("--only", help=f"Only these sections, comma-separated ({_NAMES}).")
    ] = None,
    skip: Annotated[str | None, typer.Option("--skip", help="Leave out these sections, comma-separated.")] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Run every section again instead of reusing finished ones.")
    ] = False,
    lengths: Annotated[
        str | None,
        typer.Option("--lengths", help="Lengths for context and needle, e.g. 1024,2048 (past the trained one too)."),
    ] = None,
    rope_scaling: Annotated[
        str | None,
        typer.Option("--rope-scaling", help="Context's variants: none, linear:F, dynamic:F, yarn:F, llama3:F."),
    ] = None,
    device: DeviceOpt = None,
    out: OutOpt = None,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
) -> None:
    """Run every analysis that applies to MODEL's family — each through its own command (toeplitz, fhat, profiles,
    fit-tisa, rotary; on texts: attention with sinks, data-conditioned profiles, states; causal models: context
    and needle at 256 and 512 tokens, or --lengths, with --rope-scaling's variants in context) — and write
    report.html: one self-contained page with a summary, each section's figure, key table, how to read it, and the
    command that reproduces it. Finished sections are reused on a re-run unless --force."""
    from posprobe.report import build_report

    summary = build_report(
        model,
        text=text, column=column, max_texts=max_texts, out=out, only=_names(only), skip=_names(skip),
        force=force, allow_pickle=allow_pickle, progress=lambda line: log_console.print(line, markup=False),
        lengths=lengths, rope_scaling=rope_scaling, device=device,
    )  # fmt: skip
    if json_out:
        emit_json(summary)
        return
    for claim in summary["story"]:
        console.print(claim["text"], markup=False)
    for item in summary["headline"]:
        console.print(f"{item['section']:>14}  {item['label']}: {item['text']} (against {item['reference_text']})",
                      markup=False)  # fmt: skip
    console.print(f"page: {summary['html']}", markup=False)


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]
