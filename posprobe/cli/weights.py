"""Commands `toeplitz`, `fhat`, `profiles` and `compare`: the weight-only position analyses of checkpoints."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from posprobe.cli.console import (
    any_undefined,
    console,
    emit_json,
    format_r2,
    middle_ellipsis,
    print_undefined_note,
)
from posprobe.cli.options import (
    AllowPickleOpt,
    BatchSizeOpt,
    ColumnOpt,
    DeviceOpt,
    EditOpt,
    FigureFormat,
    FormatOpt,
    JsonOpt,
    MaxLengthOpt,
    MaxMemoryOpt,
    MaxTextsOpt,
    Mode,
    ModelArg,
    ModeOpt,
    OutOpt,
    PositionsOpt,
    Scale,
    Stack,
    StackOpt,
    TextOpt,
    parse_int_list,
)
from posprobe.cli.text_input import (
    InputOpt,
    MinTextsOpt,
    check_edits,
    check_text_options,
    conditioning_lines,
    text_run,
    with_text_source,
)
from posprobe.formats.writing import default_out
from posprobe.pipelines.defaults import ALL_LAYERS, FHAT_LAYER, MODE

BY_CONSTRUCTION_MARK = "by constr."


def register(app: typer.Typer) -> None:
    app.command("toeplitz")(toeplitz)
    app.command("fhat")(fhat)
    app.command("profiles")(profiles)
    app.command("compare")(compare)


def _out_dir(out: Path | None, command: str, model_name: str) -> Path:
    from posprobe.formats.writing import prepare_out_dir

    return prepare_out_dir(out if out is not None else default_out(command, model_name))


def _resolve(model: str | None, allow_pickle: bool, with_tokenizer: bool = False):
    from posprobe.checkpoint import resolve_model

    return resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=with_tokenizer)


def toeplitz(
    model: ModelArg = None,
    block: Annotated[
        list[int] | None,
        typer.Option(
            "--block", help="Also report R² of the leading block×block sub-matrix (repeatable). Default: 128."
        ),
    ] = None,
    cosine: Annotated[bool, typer.Option("--cosine", help="Normalise rows first (cosine similarities).")] = False,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
) -> None:
    """P = E_P E_Pᵀ of the learned position embeddings, its Toeplitz R², and a heatmap."""
    from posprobe.formats.save import save
    from posprobe.pipelines import weights as pipeline

    source = _resolve(model, allow_pickle)
    out_dir = _out_dir(out, "toeplitz", source.label)
    result = pipeline.toeplitz(None, blocks=block, cosine=cosine, source=source)
    written = save(result, out_dir, fmt)
    figure, record = written["figures"][0], written.record
    if json_out:
        emit_json(record)
        return
    from rich.table import Table

    table = Table(title=f"Toeplitz R² of P = E_P E_Pᵀ{' (cosine)' if cosine else ''}", title_justify="left")
    (
        table.add_column("model"),
        table.add_column("positions", justify="right"),
        table.add_column("R² whole", justify="right"),
    )
    for b in result.blocks:
        table.add_column(f"R² first {b}", justify="right")
    r2s = [result.toeplitz_r2, *result.blocks.values()]
    table.add_row(middle_ellipsis(source.label, 28), str(result.n_positions), *[format_r2(r, short=True) for r in r2s])
    console.print(table)
    if any_undefined(r2s):
        print_undefined_note()
    if result.dropped_rows:
        console.print(
            f"[dim]dropped {result.dropped_rows} reserved leading rows (padding_idx + 1) of the "
            f"{result.model_type} position table[/dim]"
        )
    for b in result.skipped_blocks:
        console.print(f"[dim]block {b} skipped: the table has only {result.n_positions} positions[/dim]")
    console.print(f"heatmap: {figure}\nrecord:  {written['json']}")


def fhat(
    model: ModelArg = None,
    layer: Annotated[int, typer.Option("--layer", help="Layer whose Q/K weights are used (0 = first).")] = FHAT_LAYER,
    mode: ModeOpt = Mode(MODE),
    scale: Annotated[
        Scale,
        typer.Option(
            "--scale",
            help="Colour scale of the figure: one per head (default: a head with small scores still shows its "
            "pattern; each limit in its label), or one shared by all heads (to compare their sizes).",
        ),
    ] = Scale.per_head,
    positions: PositionsOpt = None,
    stack: StackOpt = Stack.encoder,
    text: TextOpt = None,
    column: ColumnOpt = None,
    text_input: InputOpt = None,
    min_texts: MinTextsOpt = None,
    max_length: MaxLengthOpt = None,
    max_texts: MaxTextsOpt = None,
    batch_size: BatchSizeOpt = None,
    device: DeviceOpt = None,
    max_memory: MaxMemoryOpt = None,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
    edit: EditOpt = None,
) -> None:
    """F̂_P, the average positional contribution to every head's attention scores, and its Toeplitz R².

    Models without a learned position table (rotary, ALiBi, relative bias, ...) get their content-free
    scores (SPEC §9): the pre-softmax scores of a sequence of the average word embedding. With --text, the
    layer's input is the mean hidden state entering it on those texts instead (SPEC §13, data-conditioned)."""
    from posprobe.formats.save import save
    from posprobe.pipelines import weights as pipeline

    options = dict(column=column, input=text_input, min_texts=min_texts, max_length=max_length,
                   max_texts=max_texts, batch_size=batch_size, device=device, max_memory=max_memory,
                   edit=edit)  # fmt: skip
    total = check_text_options(text, **options)
    source = _resolve(model, allow_pickle, with_tokenizer=text is not None)
    check_edits(edit, source, max_length)
    out_dir = _out_dir(out, "fhat", source.label)
    with text_run(text, total, **options) as text_kwargs:
        result = pipeline.fhat(
            None, layer, mode.value, source=source, positions=positions, stack=stack.value, **text_kwargs
        )
    result = with_text_source(result, text)
    layer = result.layer  # -1 (the last layer) resolved to its number, for file names and titles
    written = save(result, out_dir, fmt, scale=scale.value)
    figure, record = written["figures"][0], written.record
    if json_out:
        emit_json(record)
        return
    from rich.table import Table

    causal = " (causal: only k ≤ 0 used)" if result.causal else ""
    for line in conditioning_lines(result):
        console.print(f"[dim]{line}[/dim]")
    if result.toeplitz_by_construction:
        from posprobe.architectures.table import TABLE_KINDS
        from posprobe.pipelines.weights_results import by_construction_note

        console.print(f"F̂_P — {source.label}, layer {layer}, {result.mode} mode{causal}")
        if result.conditioning is None or result.position_kind not in TABLE_KINDS:  # else: constant, said above
            console.print(by_construction_note(result.position_kind) + "; `posprobe profiles` shows the structure.")
        console.print(f"figure: {figure}\nrecord: {written['json']}")
        return
    table = Table(
        title=f"F̂_P Toeplitz R² — {source.label}, layer {layer}, {result.mode} mode{causal}", title_justify="left"
    )
    table.add_column("head", justify="right"), table.add_column("Toeplitz R²", justify="right")
    r2 = [float(r) for r in result.toeplitz_r2]
    for h, r in enumerate(r2):
        table.add_row(str(h), format_r2(r, short=True))
    defined = [r for r in r2 if r == r]
    table.add_row("mean", format_r2(sum(defined) / len(defined) if defined else None, short=True), style="bold")
    console.print(table)
    if any_undefined(r2):
        print_undefined_note()
    console.print(f"figure: {figure}\nrecord: {written['json']}")


def profiles(
    model: ModelArg = None,
    layers: Annotated[str | None, typer.Option("--layers", help="Layers, e.g. '0,3' or 'all'.")] = ALL_LAYERS,
    window: Annotated[
        int | None, typer.Option("--window", help="Plot and summarise k = -K..K (default 20, at most n − 1).")
    ] = None,
    mode: ModeOpt = Mode(MODE),
    positions: PositionsOpt = None,
    stack: StackOpt = Stack.encoder,
    text: TextOpt = None,
    column: ColumnOpt = None,
    text_input: InputOpt = None,
    min_texts: MinTextsOpt = None,
    max_length: MaxLengthOpt = None,
    max_texts: MaxTextsOpt = None,
    batch_size: BatchSizeOpt = None,
    device: DeviceOpt = None,
    max_memory: MaxMemoryOpt = None,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
    edit: EditOpt = None,
) -> None:
    """Each head's positional profile over k = j − i, with sections at five rows i; arrays saved as .npz.

    Every family posprobe reads: learned tables (paper/faithful mode) and the content-free scores (SPEC §9) of
    rotary, ALiBi and relative-bias models. Causal models use only k ≤ 0 (marked in titles and JSON). With
    --text, each layer's input is the mean hidden state entering it on those texts (SPEC §13, data-conditioned)."""
    from posprobe.formats.save import save
    from posprobe.pipelines import weights as pipeline

    options = dict(column=column, input=text_input, min_texts=min_texts, max_length=max_length,
                   max_texts=max_texts, batch_size=batch_size, device=device, max_memory=max_memory,
                   edit=edit)  # fmt: skip
    total = check_text_options(text, **options)
    source = _resolve(model, allow_pickle, with_tokenizer=text is not None)
    check_edits(edit, source, max_length)
    out_dir = _out_dir(out, "profiles", source.label)
    with text_run(text, total, **options) as text_kwargs:
        result = pipeline.profiles(
            None,
            parse_int_list(layers, "layers"),
            mode.value,
            window=window,
            source=source,
            positions=positions,
            stack=stack.value,
            **text_kwargs,
        )
    result = with_text_source(result, text)
    written = save(result, out_dir, fmt)
    npz = written["npz"]
    if json_out:
        emit_json(result.command_record(written))
        return
    _print_peaks(result, source.label)
    for line in conditioning_lines(result):
        console.print(f"[dim]{line}[/dim]")
    if result.toeplitz_by_construction:
        console.print("[dim]F̂_P is Toeplitz by construction here: every profile is exact (the sections equal it)[/dim]")
    tag = npz.stem.removeprefix("profiles_")  # the mode, the input and the stack, as in every figure's name
    console.print(f"arrays:  {npz}\nfigures: {out_dir}/profiles_layer*_{tag}.{fmt.value}")


def _print_position_free_layers(result) -> None:
    """One line per layer without a positional term (NoPE) or without softmax attention (a hybrid's others)."""
    from posprobe.families.windows import NO_SCORE, NOPE_WORDS

    for layer, kind in zip(result.layers, result.layer_kinds or [], strict=False):
        if NOPE_WORDS in kind or NO_SCORE in kind:
            console.print(f"[dim]layer {layer}: {kind}[/dim]")


def compare(
    models: Annotated[
        list[str], typer.Argument(help="Two or more hub ids, folders or .gguf files ('all-MiniLM-L6-v2' = packaged).")
    ],
    mode: ModeOpt = Mode(MODE),
    cosine: Annotated[bool, typer.Option("--cosine", help="Cosine similarities instead of inner products.")] = False,
    positions: PositionsOpt = None,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
) -> None:
    """One table of Toeplitz statistics for several models, and side-by-side heatmaps (paper Fig. 1).

    A model without a learned table shows the head-mean of its layer-0 content-free scores, and no R² of P."""
    from posprobe.errors import ArgumentValueError
    from posprobe.formats.save import save
    from posprobe.formats.writing import prepare_out_dir
    from posprobe.pipelines import weights as pipeline

    if len(models) < 2:
        raise ArgumentValueError(
            "models", "compare needs two or more models, got one", "add another model, or use `posprobe toeplitz`"
        )
    result = pipeline.compare(models, mode.value, cosine, allow_pickle, positions=positions)
    rows, labels = list(result), [row.label for row in result]
    out_dir = prepare_out_dir(out if out is not None else default_out("compare", "-vs-".join(labels)))
    written = save(result, out_dir, fmt)
    figure, record = written["figures"][0], written.record
    if json_out:
        emit_json(record)
        return
    from rich.table import Table

    table = Table(title=f"Translation invariance ({mode.value} mode F̂_P, layer 0)", title_justify="left")
    for name in ("model", "positions", "R² whole", "R² first 128", "mean F̂_P R²"):
        table.add_column(name, justify="left" if name == "model" else "right", no_wrap=True)
    values = []
    for r, label in zip(rows, labels):
        cells = [r.toeplitz_r2, r.r2_first_128, r.mean_fhat_r2]
        texts = [
            "n/a" if v is None and i == 1 and r.n_positions < 128 else format_r2(v, short=True)
            for i, v in enumerate(cells)
        ]
        if r.has_table:
            values.append(r.toeplitz_r2)
        else:  # no P to measure: not an undefined R²
            texts[0] = texts[1] = "no table"
        if r.toeplitz_by_construction:
            texts[2] = BY_CONSTRUCTION_MARK
        table.add_row(middle_ellipsis(label, 24), str(r.n_positions), *texts)
    console.print(table)
    if any_undefined(values):
        print_undefined_note()
    if any(r.toeplitz_by_construction for r in rows):
        console.print(
            f"[dim]{BY_CONSTRUCTION_MARK} = Toeplitz by construction: the model's scores of an input that is the same "
            "at every position depend on k = j − i alone (R² = 1 whatever the weights)[/dim]"
        )
    console.print(f"figure: {figure}")


def _print_peaks(result, label: str) -> None:
    """The peak table of `profiles`: per layer and head the peak offset k, 'edge' where it is the outermost offset
    the layer covers, '*' beyond the figures' window."""
    import numpy as np
    from rich import box
    from rich.table import Table

    causal = "; causal: only k ≤ 0 used, peaks over k ≤ 0" if result.causal else ""
    window = result.window
    console.print(
        f"Head profiles — {label}, {result.mode} mode (peak k = j − i over every offset the layer uses"
        f"{causal}; figures show ±{window})"
    )
    table = Table(  # borderless: 16 heads still fit in 80 columns
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        show_edge=False,
    )
    table.add_column("layer", justify="right")
    for h in range(result.n_heads):
        table.add_column(f"h{h}", justify="right", min_width=3, no_wrap=True)
    peaks, edge = result.peak_offsets(), result.peak_at_edge()
    for li, l in enumerate(result.layers):
        cells = [
            "—" if math.isnan(k) else "edge" if at_edge else f"{int(k):+d}" + ("*" if abs(k) > window else "")
            for k, at_edge in zip(peaks[li], edge[li])
        ]
        table.add_row(str(l), *cells)
    console.print(table)
    _print_position_free_layers(result)
    if edge.any():
        console.print(
            f"[dim]edge: {int(edge.sum())} heads peak at the outermost offset they cover (k = "
            + ", ".join(f"±{int(k)}" for k in sorted(set(np.abs(peaks[edge]).tolist())))
            + "): the profile rises to where the offsets stop, not a peak inside[/dim]"
        )
    beyond = int((result.peak_beyond_window() & ~edge).sum())
    if beyond:
        console.print(f"[dim]*: {beyond} peaks lie beyond the figures' window ±{window} (--window to see them)[/dim]")
