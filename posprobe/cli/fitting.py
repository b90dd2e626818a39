"""Commands `fit-tisa` (TISA kernels fitted to head profiles) and `params` (positional parameter counts).

`fit-tisa --json` prints one object. Single S (``--kernels 5``)::

    {"model", "model_type", "mode", "kernels": 5, "window", "fitted_offsets": [lo, hi], "holdout_offsets",
     "causal", "stack", "seconds" (fitting only), "layers", "n_heads", "shared_layers", "seed",
     "convention": "k = j - i", "function", "orientation", "median_r2", "median_holdout_r2", "points",
     "parameters", "few_points", "warnings", "kernels_file", "figure",
     "heads": [{"layer", "head", "r2", "a": [S], "b": [S], "c": [S], "offset", "holdout_r2", "flags"}, ...]}

Sweep (``--kernels 1,3,5``): the same top-level keys except that ``kernels`` is the list of S,
``seconds`` the total fitting time, and the per-S parts move into
``"fits": [{"kernels": S, "seconds", "median_r2", "median_holdout_r2", "points", "parameters", "few_points",
"warnings", "kernels_file", "figure", "heads": [...]}, ...]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json, middle_ellipsis
from posprobe.cli.options import (
    AllowPickleOpt,
    FigureFormat,
    FormatOpt,
    JsonOpt,
    Mode,
    ModelArg,
    ModeOpt,
    OutOpt,
    PositionsOpt,
    Stack,
    StackOpt,
)
from posprobe.formats.writing import default_out
from posprobe.pipelines.defaults import ALL_LAYERS, FIT_TISA_KERNELS, FIT_TISA_ORIENTATION, FIT_TISA_SEED, MODE, joined


def register(app: typer.Typer) -> None:
    app.command("fit-tisa")(fit_tisa)
    app.command("params")(params)


def _parse_kernels(text: str) -> list[int]:
    from posprobe.errors import PosprobeError

    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise PosprobeError(
            f"--kernels '{text}' is not a comma-separated list of whole numbers",
            "write e.g. --kernels 5 or --kernels 1,3,5",
        ) from err
    if not values:
        raise PosprobeError("--kernels is empty", "write e.g. --kernels 5 or --kernels 1,3,5")
    return values


def _model_name(model: str | None) -> str:
    """The name used for the default output folder, known before any heavy work."""
    from posprobe.checkpoint.resolve import DEFAULT_MODEL_NAME

    if model is None or model == "":
        return DEFAULT_MODEL_NAME
    if model.endswith(".npz"):
        return Path(model).stem
    path = Path(model).expanduser()
    return path.resolve().name if path.exists() else model


def fit_tisa(
    model: ModelArg = None,
    kernels: Annotated[str, typer.Option("--kernels", help="Kernels per head S, or a sweep like '1,3,5'.")] = joined(
        FIT_TISA_KERNELS
    ),
    window: Annotated[
        int | None,
        typer.Option(
            "--window",
            help="Fit k = -W..W, a causal model's k = -W..0 (default 16; causal: at least 2 points per parameter, "
            "31 for S = 5; clipped to the offsets).",
        ),
    ] = None,
    layers: Annotated[str | None, typer.Option("--layers", help="Layers, e.g. '0,1,5' or 'all'.")] = ALL_LAYERS,
    mode: ModeOpt = Mode(MODE),
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random restarts.")] = FIT_TISA_SEED,
    orientation: Annotated[
        str,
        typer.Option(
            "--orientation",
            help="posprobe: k = j − i, (L, H, S) (what retrofit reads); official: the official TISA code's "
            "f(i − j − 1), c → −c − 1, arrays (L, S, H).",
        ),
    ] = FIT_TISA_ORIENTATION,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
    profile: Annotated[
        str | None, typer.Option("--profile", help="For a `posprobe attention` .npz: score (default) or prob.")
    ] = None,
    positions: PositionsOpt = None,
    stack: StackOpt = Stack.encoder,
) -> None:
    """Fit TISA scoring functions f(k) = Σ a·exp(−|b|(k−c)²), k = j − i, to every head's profile.

    MODEL may also be a .npz written by `posprobe profiles` or `posprobe attention` (see --profile).
    Writes tisa_kernels_S<S>.safetensors
    (a, b, c: layers × heads × S; offset: layers × heads) and a figure per S.
    """
    from posprobe.cli.console import progress_reporter
    from posprobe.cli.options import parse_int_list
    from posprobe.formats.tisa_kernels import ORIENTATIONS
    from posprobe.formats.writing import prepare_out_dir
    from posprobe.pipelines.fitting import fit_tisa as run_fit
    from posprobe.validation import as_choice

    orientation = as_choice(orientation, "orientation", ORIENTATIONS)
    kernel_list = _parse_kernels(kernels)
    layer_list = parse_int_list(layers, "layers")
    profiles = None
    if profile is not None:
        from posprobe.pipelines.fitting import load_profiles

        profiles = load_profiles(model, layer_list, profile=profile)
    out_dir = prepare_out_dir(out if out is not None else default_out("fit-tisa", _model_name(model)))
    with progress_reporter("fitting TISA kernels") as progress:
        result = run_fit(
            model,
            kernel_list,
            window=window,
            layers=layer_list,
            mode=mode.value,
            seed=seed,
            allow_pickle=allow_pickle,
            progress=progress,
            orientation=orientation,
            profiles=profiles,
            positions=positions,
            stack=stack.value,
        )
    result = result.save(out_dir, fmt.value)
    if json_out:
        emit_json(result.to_dict())
        return
    _print_fit(result)


def _print_fit(result) -> None:
    """Tables that stay readable at 80 columns: per-head R² when the heads fit across, else per layer."""
    import numpy as np
    from rich import box
    from rich.table import Table

    from posprobe.cli.console import format_r2
    from posprobe.pipelines.fitting_results import NO_SUCH_HEAD

    w = result.window
    fitted = f"k = j − i in −{w}..0 (causal)" if result.causal else f"k = j − i in ±{w}"
    head = f"TISA fit — {result.model}, {result.mode} mode, {fitted}"
    folders = {str(Path(f.kernels_file).parent) for f in result.fits if f.kernels_file is not None}
    if len(result.fits) > 1:
        table = Table(
            title=head + " (sweep)", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0), show_edge=False
        )
        for name in ("S", "params", "R²", "held-out", "min R²", "flagged", "s"):  # file names below: never folded
            table.add_column(name, justify="right", overflow="fold")
        for f in result.fits:
            flagged = sum(bool(x) and x != NO_SUCH_HEAD for row in f.flags for x in row)
            table.add_row(
                str(f.n_kernels),
                f"{3 * f.n_kernels * sum(x != NO_SUCH_HEAD for row in f.flags for x in row):,}",
                format_r2(f.median_r2),
                format_r2(f.median_holdout_r2, short=True),
                format_r2(float(np.nanmin(f.r2))),
                str(flagged),
                f"{f.seconds:.2f}",
            )
        console.print(table)
        console.print("R², held-out: medians over heads; s: seconds of fitting")
        console.print(f"folder: {', '.join(sorted(folders))}")
        for f in result.fits:
            if f.kernels_file:
                console.print(f"S={f.n_kernels}: {Path(f.kernels_file).name}", soft_wrap=True)
    else:
        f = result.fits[0]
        held = f.holdout_r2 if f.holdout_r2 is not None else np.full(f.r2.shape, np.nan)
        if 7 + 6 * result.n_heads <= console.width:  # "0.991" and one space per column, no borders
            with_held = 7 + 6 * result.n_heads + 9 <= console.width  # per-layer held-out medians too
            table = Table(
                title=head + f", S = {f.n_kernels}: R² per head",
                title_justify="left",
                box=box.SIMPLE_HEAD,
                padding=(0, 0),
                show_edge=False,
            )
            table.add_column("layer", justify="right", no_wrap=True)
            for h in range(result.n_heads):
                table.add_column(f"h{h}", justify="right", no_wrap=True, min_width=5)
            if with_held:
                table.add_column("held-out", justify="right", no_wrap=True)
            for li, layer in enumerate(result.layers):
                extra = [_median(held[li])] if with_held else []
                cells = ["—" if n == NO_SUCH_HEAD else format_r2(r, 3) for r, n in zip(f.r2[li], f.flags[li])]
                table.add_row(str(layer), *cells, *extra)
        else:
            table = Table(title=head + f", S = {f.n_kernels}: R² over heads", title_justify="left")
            for name in ("layer", "min R²", "median R²", "max R²", "worst head", "held-out"):
                table.add_column(name, justify="right", no_wrap=True)
            for li, layer in enumerate(result.layers):
                row = f.r2[li]
                table.add_row(
                    str(layer),
                    format_r2(np.nanmin(row), 3),  # NaN: a head the layer does not have (SPEC §9)
                    format_r2(float(np.nanmedian(row)), 3),
                    format_r2(np.nanmax(row), 3),
                    str(int(np.nanargmin(row))),
                    _median(held[li]),
                )
        console.print(table)
        console.print(
            f"median R² {format_r2(f.median_r2)}, held-out {format_r2(f.median_holdout_r2, short=True)}, "
            f"fitting {f.seconds:.2f} s (per-head values: --json)"
        )
        console.print(f"kernels: {f.kernels_file}\nfigure:  {f.figure}")
    console.print(f"[dim]{_holdout_note(result)}[/dim]")
    if result.shared_layers:
        console.print("[dim]shared layers (ALBERT): one layer fitted, replicated at every depth[/dim]")
    for f in result.fits:
        warning = f.warning(result.window, result.causal)
        if warning:
            console.print(f"[yellow]warning: {warning}[/yellow]")
    notes = {
        (f.n_kernels, result.layers[li], h, note)
        for f in result.fits
        for li, row in enumerate(f.flags)
        for h, note in enumerate(row)
        if note and note != NO_SUCH_HEAD and not (result.shared_layers and li)
    }
    if any(note == NO_SUCH_HEAD for f in result.fits for row in f.flags for note in row):
        console.print("[dim]—: no such head (the layer has fewer query heads than the model's most)[/dim]")
    for s, layer, h, note in sorted(notes)[:12]:
        console.print(f"[yellow]S={s} layer {layer} head {h}: {note}[/yellow]")
    if len(notes) > 12:
        console.print(f"[yellow]... and {len(notes) - 12} more flagged heads (see --json)[/yellow]")


def _median(values) -> str:
    """The median of the finite values as a table cell ('—' where there is none)."""
    import numpy as np

    from posprobe.cli.console import format_r2

    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return format_r2(float(np.median(finite)) if finite.size else None, 3, short=True)


def _holdout_note(result) -> str:
    """What the held-out column measures, with its offsets."""
    ks = list(result.holdout_offsets)
    if not ks:
        return "held-out: none (the profiles end at the fit window)"
    left = [k for k in ks if k < 0]
    right = [k for k in ks if k > 0]
    parts = [f"{min(side)}..{max(side)}" for side in (left, right) if side]
    return (
        f"held-out: R² of the fit on k = {' and '.join(parts)}, beyond the fitted window,\n"
        "against the window's mean (1 exact, 0 no better than a constant)"
    )


def params(
    model: ModelArg = None,
    radius: Annotated[int, typer.Option("--radius", help="Clip radius r of the convolutions (kernel 2r+1).")] = 8,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
) -> None:
    """Positional parameter counts of MODEL's architecture (paper Table 2 style) and of every mechanism
    `retrofit` can add, from its config."""
    from posprobe.analysis.params import positional_parameter_counts
    from posprobe.checkpoint import resolve_model
    from posprobe.mechanisms.catalogue import CATALOGUE

    source = resolve_model(model, allow_pickle=allow_pickle, require_weights=False)  # reads config.json only
    counts = positional_parameter_counts(source.config, radius=radius)
    if json_out:
        emit_json({"model": source.name, **counts.to_json(), "quantization": source.quantization})
        return
    from rich.table import Table

    c = counts
    head = f"Positional parameters —  ({c.model_type})"
    name = middle_ellipsis(source.name, max(20, console.width - len(head) - 1))  # a long path: its middle cut
    table = Table(
        title=f"Positional parameters — {name} ({c.model_type})\n"  # two lines: each fits the terminal
        f"n={'no limit' if c.n_positions is None else c.n_positions}, "
        f"d={c.table_width}, H={c.n_heads}, L={c.n_layers}, d_h={c.head_dim}, r={c.radius}",
        title_justify="left",
    )
    table.add_column("method"), table.add_column("formula"), table.add_column("parameters", justify="right")
    if c.has_learned_table:
        table.add_row("absolute learned", "n·d", f"{c.absolute:,}")
        table.add_row("untied (Ke et al.)", "n·d + 2d²", f"{c.untied:,}")
    for s, v in c.tisa.items():
        table.add_row(f"TISA, S={s}", "3·S·H·L", f"{v:,}")
    for name, info in CATALOGUE.items():
        if not info.takes_kernels:  # those are listed per S above
            table.add_row(name, info.total_formula, f"{c.mechanisms[name]:,}")
    console.print(table)
    if not c.has_learned_table:
        console.print(f"[dim]no learned absolute position table: {c.model_type} uses {c.position_encoding}[/dim]")
    if c.reserved_rows:
        console.print(
            f"[dim]{c.reserved_rows} reserved leading rows of the {c.model_type} position table "
            f"(padding_idx + 1) not counted[/dim]"
        )
    if c.table_width != c.hidden_size:
        console.print(
            f"[dim]factorised embeddings: the position table is {c.table_width} wide "
            f"(hidden size {c.hidden_size})[/dim]"
        )
