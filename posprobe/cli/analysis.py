"""Commands `toeplitz`, `fhat`, `profiles` and `compare`: position analyses of checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posprobe.analysis.toeplitz import format_r2
from posprobe.cli.console import console, emit_json
from posprobe.cli.options import (
    AllowPickleOpt,
    FigureFormat,
    FormatOpt,
    JsonOpt,
    Mode,
    ModelArg,
    ModeOpt,
    OutOpt,
    default_out,
    parse_int_list,
)


def register(app: typer.Typer) -> None:
    app.command("toeplitz")(toeplitz)
    app.command("fhat")(fhat)
    app.command("profiles")(profiles)
    app.command("compare")(compare)


def _out_dir(out: Path | None, command: str, model_name: str) -> Path:
    from posprobe.outputs import prepare_out_dir

    return prepare_out_dir(out if out is not None else default_out(command, model_name))


def _resolve(model: str | None, allow_pickle: bool):
    from posprobe.checkpoint import resolve_model

    return resolve_model(model, allow_pickle=allow_pickle)


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
    from posprobe import plotting
    from posprobe.outputs import save_figure, write_json
    from posprobe.pipelines.analysis import toeplitz_analysis

    source = _resolve(model, allow_pickle)
    out_dir = _out_dir(out, "toeplitz", source.label)
    result = toeplitz_analysis(None, blocks=block, cosine=cosine, source=source)
    stem = "P_cosine" if cosine else "P"
    figure = save_figure(plotting.heatmap(result), out_dir / f"{stem}.{fmt.value}")
    record = result.to_dict() | {"figure": str(figure), "record": str(out_dir / f"{stem}.json")}
    write_json(out_dir / f"{stem}.json", record)
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
    table.add_row(
        result.model,
        str(result.n_positions),
        format_r2(result.toeplitz_r2),
        *[format_r2(r) for r in result.blocks.values()],
    )
    console.print(table)
    if result.dropped_rows:
        console.print(
            f"[dim]dropped {result.dropped_rows} reserved leading rows (padding_idx + 1) of the "
            f"{result.model_type} position table[/dim]"
        )
    console.print(f"heatmap: {figure}\nrecord:  {out_dir / f'{stem}.json'}")


def fhat(
    model: ModelArg = None,
    layer: Annotated[int, typer.Option("--layer", help="Layer whose Q/K weights are used (0 = first).")] = 0,
    mode: ModeOpt = Mode.paper,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
) -> None:
    """F̂_P, the average positional contribution to every head's attention scores, and its Toeplitz R²."""
    from posprobe import plotting
    from posprobe.outputs import save_mosaic, write_json
    from posprobe.pipelines.analysis import fhat_analysis

    source = _resolve(model, allow_pickle)
    out_dir = _out_dir(out, "fhat", source.label)
    result = fhat_analysis(None, layer, mode.value, source=source)
    stem = f"fhat_layer{layer}_{mode.value}"
    figure = save_mosaic(plotting.fhat_grid(result), out_dir / f"{stem}.{fmt.value}")
    record = result.to_dict() | {"figure": str(figure), "record": str(out_dir / f"{stem}.json")}
    write_json(out_dir / f"{stem}.json", record)
    if json_out:
        emit_json(record)
        return
    from rich.table import Table

    table = Table(title=f"F̂_P Toeplitz R² — {result.model}, layer {layer}, {mode.value} mode", title_justify="left")
    table.add_column("head", justify="right"), table.add_column("Toeplitz R²", justify="right")
    for h, r in enumerate(result.toeplitz_r2):
        table.add_row(str(h), format_r2(r))
    table.add_row("mean", format_r2(result.mean_toeplitz_r2), style="bold")
    console.print(table)
    console.print(f"figure: {figure}\nrecord: {out_dir / f'{stem}.json'}")


def profiles(
    model: ModelArg = None,
    layers: Annotated[str | None, typer.Option("--layers", help="Layers, e.g. '0,3' or 'all'.")] = "all",
    window: Annotated[int, typer.Option("--window", help="Plot and summarise k = -K..K.")] = 20,
    mode: ModeOpt = Mode.paper,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
) -> None:
    """Each head's positional profile over k = j − i, with sections at five rows i; arrays saved as .npz."""
    from posprobe import plotting
    from posprobe.outputs import save_figure, save_npz
    from posprobe.pipelines.analysis import compute_profiles

    source = _resolve(model, allow_pickle)
    out_dir = _out_dir(out, "profiles", source.label)
    result = compute_profiles(None, parse_int_list(layers, "layers"), mode.value, window=window, source=source)
    npz = save_npz(
        out_dir / f"profiles_{mode.value}.npz",
        result.metadata(),
        profiles=result.profiles,
        offsets=result.offsets,
        layers=np.asarray(result.layers),
        fhat_r2=result.fhat_r2,
        sections=result.sections,
        section_rows=np.asarray(result.section_rows),
    )
    figures = [
        save_figure(plotting.profile_grid(result, i), out_dir / f"profiles_layer{l}_{mode.value}.{fmt.value}")
        for i, l in enumerate(result.layers)
    ]
    if json_out:
        emit_json(result.to_dict() | {"npz": str(npz), "figures": [str(f) for f in figures]})
        return
    from rich.table import Table

    table = Table(
        title=f"Head profiles — {result.model}, {mode.value} mode (peak k = j − i within ±{window})",
        title_justify="left",
    )
    table.add_column("layer", justify="right")
    for h in range(result.n_heads):
        table.add_column(f"h{h}", justify="right")
    centre = result.n_positions - 1
    for li, l in enumerate(result.layers):
        window_part = result.profiles[li, :, centre - window : centre + window + 1]
        table.add_row(str(l), *[f"{int(k):+d}" for k in np.argmax(window_part, axis=1) - window])
    console.print(table)
    console.print(f"arrays:  {npz}\nfigures: {out_dir}/profiles_layer*_{mode.value}.{fmt.value}")


def compare(
    models: Annotated[
        list[str], typer.Argument(help="Two or more hub ids or folders ('all-MiniLM-L6-v2' = packaged).")
    ],
    mode: ModeOpt = Mode.paper,
    cosine: Annotated[bool, typer.Option("--cosine", help="Cosine similarities instead of inner products.")] = False,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
) -> None:
    """One table of Toeplitz statistics for several models, and side-by-side heatmaps (paper Fig. 1)."""
    from posprobe import plotting
    from posprobe.outputs import prepare_out_dir, save_figure, write_json
    from posprobe.pipelines.analysis import compare_models

    out_dir = prepare_out_dir(
        out if out is not None else default_out("compare", "-vs-".join(Path(m).name or m for m in models))
    )
    rows = compare_models(models, mode.value, cosine, allow_pickle)
    figure = save_figure(plotting.compare_heatmaps(rows), out_dir / f"compare.{fmt.value}")
    record = {"mode": mode.value, "cosine": cosine, "models": [r.to_dict() for r in rows], "figure": str(figure)}
    write_json(out_dir / "compare.json", record)
    if json_out:
        emit_json(record)
        return
    from rich.table import Table

    table = Table(title=f"Translation invariance ({mode.value} mode F̂_P, layer 0)", title_justify="left")
    for name in ("model", "positions", "R² whole", "R² first 128", "mean per-head F̂_P R²"):
        table.add_column(name, justify="left" if name == "model" else "right")
    fmt_r = lambda v: "—" if v is None else format_r2(v)  # noqa: E731
    for r in rows:
        table.add_row(r.model, str(r.n_positions), fmt_r(r.toeplitz_r2), fmt_r(r.r2_first_128), fmt_r(r.mean_fhat_r2))
    console.print(table)
    console.print(f"figure: {figure}")


import numpy as np  # noqa: E402  (used by `profiles`; numpy is light next to torch)
