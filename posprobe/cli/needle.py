"""Command `needle`: retrieval by length and depth — a pass key (or any needle) in a haystack of real text, scored
per prompt by log-probability, greedy exact match and needle attention per head (needle-attending heads) and Wu et
al.'s retrieval score (SPEC §18).

Writes needle.npz (`log_prob`, `exact`, `needle_attention` shaped (lengths, depths, trials[, layers, heads]),
`lengths`, `depths`, `achieved_length`, `achieved_depth`, `needle_tokens`, `uniform_share`, `accuracy`,
`mean_log_prob`), prompts.jsonl (one record per prompt), needle.txt (the table) and three figures.
`needle --json` prints `NeedleResult.to_dict()` plus the paths of the files.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json, log_console
from posprobe.cli.options import (
    AllowPickleOpt,
    DeviceOpt,
    EditOpt,
    FigureFormat,
    FormatOpt,
    JsonOpt,
    MaxMemoryOpt,
    OutOpt,
)
from posprobe.formats.writing import default_out
from posprobe.pipelines.defaults import (
    NEEDLE_DEPTHS,
    NEEDLE_DIGITS,
    NEEDLE_HAYSTACK,
    NEEDLE_LENGTHS,
    NEEDLE_MODEL,
    NEEDLE_SEED,
    NEEDLE_TRIALS,
    joined,
)


def register(app: typer.Typer) -> None:
    app.command("needle", short_help="Needle in a haystack: retrieval by length and depth, and the heads that do it.")(
        needle
    )


def needle(
    model: Annotated[
        str | None,
        typer.Argument(
            help=f"Causal LM: hub id, folder or .gguf file (default: the packaged {NEEDLE_MODEL}).",
            show_default=False,
        ),
    ] = None,  # fmt: skip
    haystack: Annotated[
        str, typer.Option("--haystack", help="Text file (one text per line) or builtin:kjv / builtin:sentences.")
    ] = NEEDLE_HAYSTACK,
    lengths: Annotated[str, typer.Option("--lengths", help="Prompt lengths in tokens, e.g. 256,512,1024.")] = joined(
        NEEDLE_LENGTHS
    ),
    depths: Annotated[str, typer.Option("--depths", help="Needle depths (0..1), e.g. 0,0.25,0.5,0.75,1.")] = joined(
        NEEDLE_DEPTHS
    ),
    trials: Annotated[
        int, typer.Option("--trials", help="Prompts per (length, depth), each its own key.")
    ] = NEEDLE_TRIALS,
    needle_template: Annotated[
        str | None, typer.Option("--needle", help="Needle sentence with {answer}, e.g. ' The secret word is {answer}.'")
    ] = None,
    question: Annotated[
        str | None, typer.Option("--question", help="The prompt's end; the answer follows it (\\n: a new line).")
    ] = None,
    intro: Annotated[
        str | None, typer.Option("--intro", help="Text before the haystack (default: the pass-key one).")
    ] = None,  # fmt: skip
    answer: Annotated[
        str | None, typer.Option("--answer", help="A fixed answer (default: a random pass key per trial).")
    ] = None,
    digits: Annotated[int, typer.Option("--digits", help="Digits of the random pass key.")] = NEEDLE_DIGITS,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the pass keys.")] = NEEDLE_SEED,
    beyond_window: Annotated[
        bool, typer.Option("--beyond-window", help="Allow lengths past the model's trained positions.")
    ] = False,
    chat: Annotated[
        bool, typer.Option("--chat", help="The tokenizer's own chat template (default where it ships one).")
    ] = False,
    no_chat: Annotated[bool, typer.Option("--no-chat", help="Plain continuation, even for a chat model.")] = False,
    device: DeviceOpt = None,
    max_memory: MaxMemoryOpt = None,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
    edit: EditOpt = None,
) -> None:
    """A needle (by default a random 5-digit pass key) hidden in a haystack of real text (default: the King James
    Bible) at each prompt length and depth; per prompt the answer's teacher-forced log-probability, greedy exact
    match, and the attention the last prompt token gives the needle in every layer and head. Lengths and depths are
    measured in tokens, never capped: a haystack too short for a length is refused. A tokenizer that ships a chat
    template gets its prompts in it (--no-chat: plain continuation): the intro, haystack and question as the
    user's message, the question's last words ('The pass key is') opening the assistant's reply."""
    from posprobe.capture.model import check_max_memory
    from posprobe.checkpoint import resolve_model
    from posprobe.edits import prepare_edits
    from posprobe.errors import ArgumentValueError
    from posprobe.formats.save import save
    from posprobe.formats.writing import prepare_out_dir
    from posprobe.pipelines.needle import NeedleGrid
    from posprobe.pipelines.needle import needle as run_needle
    from posprobe.pipelines.needle_prompts import DEFAULT_INTRO, DEFAULT_NEEDLE, DEFAULT_QUESTION, NeedleTask

    if chat and no_chat:
        raise ArgumentValueError("chat", "{arg} and --no-chat cannot be combined", "pass one of them, or neither")
    grid = NeedleGrid(
        lengths=_numbers(lengths, "lengths", int),
        depths=_numbers(depths, "depths", float),
        trials=trials,
        seed=seed,
        beyond_window=beyond_window,
    )
    task = NeedleTask(
        intro=DEFAULT_INTRO if intro is None else _newlines(intro),
        needle=DEFAULT_NEEDLE if needle_template is None else _newlines(needle_template),
        question=DEFAULT_QUESTION if question is None else _newlines(question),
        answer=answer,
        digits=digits,
        chat=True if chat else False if no_chat else None,
    )
    check_max_memory(device, max_memory)
    source = resolve_model(model or NEEDLE_MODEL, allow_pickle=allow_pickle, with_tokenizer=True)
    edits = prepare_edits(edit, source.config, source.name, max(grid.lengths))  # the exact check: in the pipeline
    out_dir = prepare_out_dir(out if out is not None else default_out("needle", source.label))
    with _prompt_progress() as progress:
        result = run_needle(None, haystack=haystack, grid=grid, task=task, device=device, progress=progress,
                            allow_pickle=allow_pickle, source=source, max_memory=max_memory, edits=edits)  # fmt: skip
    written = save(result, out_dir, fmt)
    if json_out:
        emit_json(result.command_record(written))
        return
    paths = result.command_record(written)["files"]
    console.print(f"Needle — {result.model}, haystack {result.haystack}, {len(result.records)} prompts")
    console.print(result.table(), markup=False)
    console.print(
        "[dim]acc: share of trials whose greedy continuation is exactly the answer; lp: mean log p(answer) in nats; "
        "primacy / recency: first / last depth minus the mean of the middle depths (accuracy, then log p); "
        "(Nx): times the attention a uniform query row would give the needle.[/dim]"
    )
    console.print("\n".join(f"{name}: {path}" for name, path in paths.items()))


def _newlines(template: str) -> str:
    """A template as typed on a command line: the two characters \\n stand for a new line."""
    return template.replace("\\n", "\n")


def _numbers(text: str, name: str, kind):
    """'256,512' -> [256, 512] (kind int or float); one-line error for anything else."""
    from posprobe.errors import ArgumentValueError

    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        word = "whole numbers" if kind is int else "numbers"
        raise ArgumentValueError(name, f"{{arg}} '{text}' is not a list of {word}", "e.g. {arg} "
                                 + ("256,512,1024" if kind is int else "0,0.5,1")) from None  # fmt: skip
    if not values:
        raise ArgumentValueError(name, "{arg} is empty", "pass at least one value")
    return values


@contextmanager
def _prompt_progress():
    """A progress bar over prompts on stderr (when stderr is a terminal: also under --json and inside `report`),
    yielding `progress(done, total)`."""
    if not log_console.is_terminal or log_console.quiet:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("prompts"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=log_console,
        transient=True,
    ) as bar:
        task = bar.add_task("prompts", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
