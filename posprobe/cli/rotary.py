"""Command `rotary`: how much of each head's query and key norm lives in each rotary frequency band (SPEC §15).

`rotary --json` prints one object: `model`, `model_type`, `mode` ('content-free' or 'text'), `layers`, `n_layers`,
`n_heads`, `n_kv_heads`, `head_dim`, `rotated_dims`, `partial_rotary`, `pairing`, `rotary_scale`, `n_positions`,
`max_positions`, `context`, `texts` (null, or `text`, `n_texts`, `n_tokens`, `max_length`, `longest_text`), `note`,
`wavelengths` (L_sel x r/2, tokens), `summary` (per layer: `q_long_band_share` / `k_long_band_share`, the share of
the summed band norms in bands longer than the context, mean over heads; `long_band_fraction`, the same for
equal band norms (the share of such bands); `q_peak_wavelength` /
`k_peak_wavelength`, the band with the largest mean norm), `npz` (`q_band_norm` (L_sel, H, r/2), `k_band_norm`
(L_sel, H_kv, r/2), `frequencies`, `wavelengths` (L_sel, r/2), `q_unrotated_norm`, `k_unrotated_norm`, `layers`)
and `figure`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json
from posprobe.cli.options import (
    AllowPickleOpt,
    FigureFormat,
    FormatOpt,
    JsonOpt,
    ModelArg,
    OutOpt,
    PositionsOpt,
    parse_int_list,
)
from posprobe.cli.text_input import (
    BatchSizeOpt,
    ColumnOpt,
    DeviceOpt,
    MaxLengthOpt,
    MaxTextsOpt,
    TextOpt,
    check_text_options,
    text_run,
)
from posprobe.outputs import default_out


def register(app: typer.Typer) -> None:
    app.command("rotary", short_help="Query and key norm in each rotary frequency band, per layer and head.")(rotary)


def rotary(
    model: ModelArg = None,
    layers: Annotated[str | None, typer.Option("--layers", help="Layers, e.g. '0,15,29' or 'all'.")] = "all",
    positions: PositionsOpt = None,
    text: TextOpt = None,
    column: ColumnOpt = None,
    max_length: MaxLengthOpt = None,
    max_texts: MaxTextsOpt = None,
    batch_size: BatchSizeOpt = None,
    device: DeviceOpt = None,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
) -> None:
    """Per layer and head, the norm of the queries and keys in each rotary frequency band, with the band's
    wavelength in tokens (rope scaling included): of the content-free input, or averaged over real tokens with
    --text. Rotary families only."""
    from dataclasses import replace

    from posprobe.checkpoint import resolve_model
    from posprobe.outputs import figure_writer, prepare_out_dir, write_files, write_npz
    from posprobe.pipelines.rotary import rotary as rotary_bands

    options = dict(column=column, max_length=max_length, max_texts=max_texts, batch_size=batch_size, device=device)
    total = check_text_options(text, **options)
    source = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=text is not None)
    out_dir = prepare_out_dir(out if out is not None else default_out("rotary", source.label))
    with text_run(text, total, **options) as text_kwargs:
        result = rotary_bands(None, parse_int_list(layers, "layers"), positions=positions, source=source, **text_kwargs)
    if text is not None:
        result = replace(result, texts={**result.texts, "text": str(text)})
    written = write_files(
        out_dir,
        {
            "rotary.npz": lambda p: write_npz(p, result.metadata(), **result.arrays()),
            f"rotary_bands.{fmt.value}": figure_writer(result.plot),
        },
    )
    npz, figure = written.values()
    if json_out:
        emit_json(result.to_dict() | {"npz": str(npz), "figure": str(figure)})
        return
    _print(result)
    console.print(f"arrays: {npz}\nfigure: {figure}")


def _print(result) -> None:
    from rich.table import Table

    record = result.to_dict()
    table = Table(
        title=f"Rotary bands — {result.model}, {result.mode} ({result.rotated_dims // 2} bands per head)",
        title_justify="left",
    )
    for name in ("layer", "q long", "k long", "equal", "q peak λ", "k peak λ"):
        table.add_column(name, justify="right")
    fmt = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    peak = lambda v: "—" if v is None else f"{v:,.0f}"  # noqa: E731
    for row in record["summary"]:
        table.add_row(str(row["layer"]), fmt(row["q_long_band_share"]), fmt(row["k_long_band_share"]),
                      fmt(row["long_band_fraction"]), peak(row["q_peak_wavelength"]),
                      peak(row["k_peak_wavelength"]))  # fmt: skip
    console.print(table)
    console.print(
        f"[dim]long: share of the summed band norms (mean over heads) in bands whose wavelength exceeds the context "
        f"({result.context} tokens); equal: the same if every band had the same norm (the share of such bands); "
        f"peak λ: wavelength in tokens of the band with the largest mean norm. "
        f"{result.note()}[/dim]"
    )
