"""Command `ablate`: a study of edits with its controls (issue 46) — the baseline and each `--edit` (SPEC §20; '+'
joins edits into one run) on the same windows or prompts, each run's effect on the readout as a paired difference
with its 95 % interval, and with `--control random:K --seeds N` the same edit on K random heads or rotary bands.

Writes ablate.npz (each run's value per window or prompt), prompts.jsonl (needle) or windows.jsonl (every unit's
value in every run), ablate.txt (the table), ablate.json (the record `--json` prints) and the figures
(`ablate_effects`, `ablate_loss` for context, `ablate_grid` for needle).
"""

from __future__ import annotations

from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json
from posprobe.cli.options import AllowPickleOpt, DeviceOpt, EditOpt, FigureFormat, FormatOpt, JsonOpt, OutOpt
from posprobe.formats.writing import default_out

_DEFAULT_MODEL = "SmolLM2-135M-Instruct"


def register(app: typer.Typer) -> None:
    app.command("ablate", short_help="Edits against a baseline and random controls: what changes when you edit.")(
        ablate
    )


def ablate(
    model: Annotated[
        str | None,
        typer.Argument(
            help=f"Causal LM: folder or .gguf file (default: the packaged {_DEFAULT_MODEL}).", show_default=False
        ),
    ] = None,  # fmt: skip
    readout: Annotated[str, typer.Option("--readout", help="context, needle or attention.")] = "context",
    edit: EditOpt = None,
    control: Annotated[
        str | None, typer.Option("--control", help="random:K — the first head or band edit on K random ones.")
    ] = None,
    seeds: Annotated[int, typer.Option("--seeds", help="Control runs, one random draw each.")] = 5,
    text: Annotated[str, typer.Option("--text", help="context/attention: texts (a file or builtin:kjv).")] = (
        "builtin:kjv"
    ),
    length: Annotated[int, typer.Option("--length", help="context/attention: window length in tokens.")] = 512,
    windows: Annotated[int, typer.Option("--windows", help="context/attention: windows (the paired units).")] = 8,
    from_position: Annotated[
        int, typer.Option("--from-position", help="context: score the tokens at positions >= this.")
    ] = 0,
    haystack: Annotated[str, typer.Option("--haystack", help="needle: the haystack.")] = "builtin:kjv",
    lengths: Annotated[str, typer.Option("--lengths", help="needle: prompt lengths in tokens.")] = "256,512",
    depths: Annotated[str, typer.Option("--depths", help="needle: needle depths (0..1).")] = "0,0.5,1",
    trials: Annotated[int, typer.Option("--trials", help="needle: prompts per (length, depth).")] = 2,
    seed: Annotated[int, typer.Option("--seed", help="needle: seed of the pass keys.")] = 0,
    device: DeviceOpt = None,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
) -> None:
    """The baseline and each --edit on the same windows (--readout context: mean loss over positions; attention:
    first-token mass) or needle prompts (mean answer log-probability, exact match, Wu et al.'s retrieval score).
    Heads can be named by the baseline's own measurement: head:retrieval:K (needle) or head:sink:K. Effects are
    paired over windows or prompts: delta, 95% t interval, sign-flip p (SPEC §12)."""
    from posprobe.checkpoint import resolve_model
    from posprobe.cli.needle import _numbers
    from posprobe.errors import ArgumentValueError
    from posprobe.formats.save import save
    from posprobe.formats.writing import prepare_out_dir
    from posprobe.pipelines.ablate import ablate as run_ablate
    from posprobe.pipelines.needle import NeedleGrid

    k = None
    if control is not None:
        kind, _, count = control.partition(":")
        if kind != "random" or not count.isdigit() or int(count) < 1:
            raise ArgumentValueError("control", f"{{arg}} '{control}' is not random:K", "e.g. --control random:10")
        k = int(count)
    grid = None
    if readout == "needle":
        grid = NeedleGrid(lengths=_numbers(lengths, "lengths", int), depths=_numbers(depths, "depths", float),
                          trials=trials, seed=seed)  # fmt: skip
    if not edit:
        raise ArgumentValueError("edit", "ablate needs at least one {arg}", "e.g. --edit head:retrieval:10")
    if readout != "needle":
        from posprobe.texts.reading import check_texts

        check_texts(text, None, 1)
    source = resolve_model(model or _DEFAULT_MODEL, allow_pickle=allow_pickle, with_tokenizer=True)
    options = dict(readout=readout, control=k, seeds=seeds, texts=text, length=length, windows=windows,
                   from_position=from_position, haystack=haystack, grid=grid, device=device)  # fmt: skip
    from posprobe.pipelines.ablate import check_options

    check_options(edit, source, **options)
    result = run_ablate(None, edit, source=source, allow_pickle=allow_pickle, **options)
    out_dir = prepare_out_dir(out if out is not None else default_out("ablate", source.label))  # after the run:
    # anything refused on the way (texts too short, an edit the loaded model cannot take) writes nothing
    written = save(result, out_dir, fmt)
    files = {name.rsplit(".", 1)[0]: str(path) for name, path in written.paths.items()}
    if json_out:
        emit_json(result.to_dict() | {"files": files})
        return
    console.print(f"Ablate — {result.model}", markup=False)
    console.print(result.table(), markup=False)
    console.print("\n".join(f"{name}: {path}" for name, path in files.items()), markup=False)
