"""Command `context`: loss by position across long windows and perplexity per length, per rotary scaling variant,
with the rotary budget (SPEC §17); `--edit` (repeatable) edits the model in every pass (SPEC §20).

`context --json` prints one object: `model`, `model_type`, `position_kind`, `variants`, `lengths`,
`trained_length`, `max_positions`, `beyond_trained_length`, `text` (`source`, `documents_used`, `stream_tokens`,
`bos_id`, `eos_id`), `windows`, `tokens` (per length), `perplexity` (variant -> length -> value),
`perplexity_interval` (variant -> length -> [low, high]: 95 % over the windows; nulls with one window), `loss_by_octave`
(`position_bins` and variant -> mean loss per bin), `scored_tokens` (length -> the tokens its perplexity is over:
the same tokens at every length; `text.scored_stream_tokens` and `text.window_starts_left_out` say which), `budget`
(null without rotary embeddings), `edits` (as written), `note`, `npz`
(`position_loss` (V, L-1), `perplexity` (V, n), `perplexity_interval` (V, n, 2), `inv_freq` (V, d/2),
`attention_scaling` (V,), `variants`, `lengths`, `windows`, `tokens`) and `figures`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json, log_console
from posprobe.cli.options import (
    AllowPickleOpt,
    ColumnOpt,
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
    CONTEXT_BATCH_SIZE,
    CONTEXT_LENGTHS,
    CONTEXT_TEXT,
    CONTEXT_WINDOWS,
    ROPE_SCALING,
    joined,
)


def register(app: typer.Typer) -> None:
    app.command("context", short_help="Loss by position and perplexity by length, per rotary scaling variant.")(context)


def context(
    model: Annotated[
        str,
        typer.Argument(
            help="A causal LM: hub id, folder or .gguf file ('SmolLM2-135M-Instruct' = packaged).", show_default=False
        ),  # fmt: skip
    ],
    text: Annotated[
        str,
        typer.Option("--text", help="Long texts (documents): a file as for other commands, or builtin:kjv (default)."),
    ] = CONTEXT_TEXT,
    column: ColumnOpt = None,
    lengths: Annotated[
        str,
        typer.Option("--lengths", help="Window lengths in tokens, e.g. 512,1024,2048 (past the trained length too)."),
    ] = joined(CONTEXT_LENGTHS),
    windows: Annotated[
        int, typer.Option("--windows", help="Windows of the longest length; shorter ones score the same tokens.")
    ] = CONTEXT_WINDOWS,
    rope_scaling: Annotated[
        str,
        typer.Option("--rope-scaling", help="Variants: none, linear:F, dynamic:F, yarn:F, llama3:F (comma list)."),
    ] = ROPE_SCALING,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Windows per forward pass.")] = CONTEXT_BATCH_SIZE,
    device: DeviceOpt = None,
    max_memory: MaxMemoryOpt = None,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
    edit: EditOpt = None,
) -> None:
    """Loss at each position of long windows (documents joined with EOS, a BOS per window where the tokenizer adds
    one) and perplexity per window length, for the model as it is and for each rotary scaling variant (transformers'
    own rope initialisation), with the rotary budget. Lengths past the trained length are allowed and said so."""
    from posprobe.capture.textrun import check_run_settings
    from posprobe.checkpoint import resolve_model
    from posprobe.edits import prepare_edits
    from posprobe.families.rope_variants import parse_variants
    from posprobe.formats.save import save
    from posprobe.formats.writing import prepare_out_dir
    from posprobe.pipelines.context import check_family, check_lengths
    from posprobe.pipelines.context import context as run_context
    from posprobe.texts.reading import check_texts, iter_texts
    from posprobe.validation import as_int

    length_list = check_lengths(lengths)
    as_int(windows, "windows", minimum=1)
    check_run_settings(batch_size=batch_size, device=device, max_memory=max_memory)
    variants = parse_variants(rope_scaling)
    check_texts(text, column, 1)
    source = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=True)
    check_family(source, variants, length_list)
    edits = prepare_edits(edit, source.config, source.name, length_list[-1])
    with _progress() as advance:
        result = run_context(None, length_list, texts=iter_texts(text, column), windows=windows,
                             rope_scaling=rope_scaling, batch_size=batch_size, device=device, progress=advance,
                             allow_pickle=allow_pickle, source=source, max_memory=max_memory, edits=edits)  # fmt: skip
    from dataclasses import replace

    result = replace(result, text={"source": text, **result.text})
    out_dir = prepare_out_dir(out if out is not None else default_out("context", source.label))
    written = save(result, out_dir, fmt)
    npz, record, figures = written["npz"], written["json"], written["figures"]
    if json_out:
        emit_json(result.command_record(written))
        return
    _print(result)
    console.print(f"arrays: {npz}\njson: {record}\nfigures: {', '.join(str(f) for f in figures)}")


def _progress():
    """A progress bar over forward passes on stderr (only when stderr is a terminal: also under --json, and inside
    `report`), yielding `advance(done, total)`."""
    from contextlib import contextmanager

    @contextmanager
    def bar():
        if not log_console.is_terminal or log_console.quiet:
            yield None
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(TextColumn("forward passes"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=log_console, transient=True) as progress:  # fmt: skip
            task = progress.add_task("forward", total=None)
            yield lambda done, total: progress.update(task, completed=done, total=total)

    return bar()


def _print(result) -> None:
    from rich.table import Table

    record = result.to_dict()
    windows = ", ".join(f"{n:,}: {w}" for n, w in zip(result.lengths, result.windows))
    table = Table(title=f"Perplexity by window length — {result.model} (windows {windows})", title_justify="left")
    table.add_column("variant")
    for n in result.lengths:
        past = " *" if n in result.beyond_trained else ""
        table.add_column(f"{n:,}{past}", justify="right")
    intervals = record.get("perplexity_interval") or {}
    for name in result.variants:
        cells = []
        for n in result.lengths:
            cell = f"{record['perplexity'][name][str(n)]:.3f}"
            low, high = (intervals.get(name) or {}).get(str(n)) or (None, None)
            cells.append(cell if low is None else f"{cell} [dim]({low:.2f}–{high:.2f})[/dim]")
        table.add_row(name, *cells)
    scored = record["scored_tokens"]
    table.add_row("[dim]tokens scored[/dim]", *(f"[dim]{scored[str(n)]:,}[/dim]" for n in result.lengths))
    console.print(table)
    octaves = record["loss_by_octave"]
    bins = Table(title=f"Mean loss (nats) by position t, windows of {result.lengths[-1]:,}", title_justify="left")
    bins.add_column("t")
    for name in result.variants:
        bins.add_column(name, justify="right")
    for k, (a, b) in enumerate(octaves["position_bins"]):
        bins.add_row(f"{a}" if b == a + 1 else f"{a}-{b - 1}", *(f"{octaves[name][k]:.3f}" for name in result.variants))
    console.print(bins)
    lines = [f"trained length: {result.trained_length:,}" if result.trained_length else "trained length: unknown"]
    if intervals:
        lines.append("(low–high): 95 % interval over the windows (Student's t on the windows' mean loss; none with 1)")
    if result.beyond_trained:
        lines.append(f"* past the trained length: {', '.join(map(str, result.beyond_trained))} (extrapolation)")
    if result.budget:
        b = result.budget
        lines.append(
            f"rotary budget (Liu et al. 2023): critical dimension {b['critical_dimension']} of {b['rotated_dims']}, "
            f"extrapolation limit {b['extrapolation_limit']:,.0f} tokens (theta {b['rope_theta']:g}, trained length "
            f"{b['trained_length']:,}); pairs with a wavelength past the trained length: "
            + ", ".join(f"{v['variant']} {v['pairs_beyond_trained_length']}" for v in b["variants"])
        )
    console.print("[dim]" + "\n".join(lines + [result.note()]) + "[/dim]")
