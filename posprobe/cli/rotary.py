"""Command `rotary`: how much of each head's query and key norm lives in each rotary frequency band (SPEC §15).

`rotary --json` prints one object: `model`, `model_type`, `mode` ('content-free' or 'text'), `layers`, `n_layers`,
`n_heads`, `n_kv_heads`, `head_dim`, `rotated_dims`, `partial_rotary`, `pairing`, `rotary_scale`, `n_positions`,
`max_positions`, `context`, `texts` (null, or `text`, `n_texts`, `n_tokens`, `max_length`, `longest_text`), `note`,
`layer_contexts` (the context each layer is read against: its sliding window, else `context`), `budget`
(`critical_dimension`, `extrapolation_limit`, `trained_length`, `rotated_dims`, `rope_theta`, `pairs`,
`pairs_with_full_period`, `variants`: per --rope-scaling variant its `wavelengths`, `pairs_beyond_trained_length`,
`longest_wavelength`; null for a rotary module not built from rope parameters), `wavelengths` (L_sel x r/2,
tokens), `summary` (per layer: `q_long_band_share` / `k_long_band_share`, the share of the summed band norms in
bands longer than the layer's context, mean over heads; `long_band_fraction`, the same for equal band norms (the
share of such bands); `q_peak_wavelength` / `k_peak_wavelength`, the band with the largest mean norm), `npz`
(`q_band_norm` (L_sel, H, r/2), `k_band_norm` (L_sel, H_kv, r/2), `frequencies`, `wavelengths` (L_sel, r/2),
`q_unrotated_norm`, `k_unrotated_norm`, `layers`) and `figure`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json
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
    ModelArg,
    OutOpt,
    PositionsOpt,
    TextOpt,
    parse_int_list,
)
from posprobe.cli.text_input import check_edits, check_text_options, text_run
from posprobe.errors import ArgumentValueError
from posprobe.formats.writing import default_out
from posprobe.pipelines.defaults import ALL_LAYERS, ROPE_SCALING


def register(app: typer.Typer) -> None:
    app.command("rotary", short_help="Query and key norm in each rotary frequency band, per layer and head.")(rotary)


def rotary(
    model: ModelArg = None,
    layers: Annotated[str | None, typer.Option("--layers", help="Layers, e.g. '0,15,29' or 'all'.")] = ALL_LAYERS,
    positions: PositionsOpt = None,
    text: TextOpt = None,
    column: ColumnOpt = None,
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
    rope_scaling: Annotated[
        str,
        typer.Option("--rope-scaling", help="Variants for the budget: none, linear:F, dynamic:F, yarn:F, llama3:F."),
    ] = ROPE_SCALING,
) -> None:
    """Per layer and head, the norm of the queries and keys in each rotary frequency band, with the band's
    wavelength in tokens (rope scaling included): of the content-free input, or averaged over real tokens with
    --text; each layer read against what it sees (its sliding window, else the model's context). With the rotary
    budget (critical dimension, extrapolation limit), which needs only the config: a folder with a config.json and
    no weights gets the budget alone. Rotary families only."""
    from dataclasses import replace

    from posprobe.checkpoint import resolve_model
    from posprobe.families.rope_variants import parse_variants
    from posprobe.formats.save import save
    from posprobe.formats.writing import prepare_out_dir
    from posprobe.pipelines.rotary import config_budget
    from posprobe.pipelines.rotary import rotary as rotary_bands

    parse_variants(rope_scaling)
    options = dict(column=column, max_length=max_length, max_texts=max_texts, batch_size=batch_size, device=device,
                   max_memory=max_memory, edit=edit)  # fmt: skip
    total = check_text_options(text, **options)
    if _config_only(model):
        if text is not None:
            raise ArgumentValueError("text", f"{{arg}}: band norms on text need weights, and '{model}' holds only a "
                                     "config", "pass the folder with its weights, or drop {arg}")  # fmt: skip
        record = config_budget(resolve_model(model, require_weights=False), rope_scaling)
        if json_out:
            emit_json(record)
            return
        console.print(f"Rotary budget — {record['model']}\n{_budget_line(record['budget'])}")
        console.print(f"[dim]{record['note']}[/dim]")
        return
    source = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=text is not None)
    check_edits(edit, source, max_length)
    out_dir = prepare_out_dir(out if out is not None else default_out("rotary", source.label))
    with text_run(text, total, **options) as text_kwargs:
        result = rotary_bands(None, parse_int_list(layers, "layers"), positions=positions, source=source,
                              rope_scaling=rope_scaling, **text_kwargs)  # fmt: skip
    if text is not None:
        result = replace(result, texts={**result.texts, "text": str(text)})
    written = save(result, out_dir, fmt)
    npz, figure = written["npz"], written["figures"][0]
    if json_out:
        emit_json(result.command_record(written))
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
        f"({result.context} tokens; a layer with a sliding window: its window); equal: "
        "the same if every band had the same norm (the share of such bands); "
        f"peak λ: wavelength in tokens of the band with the largest mean norm. "
        f"{result.note()}[/dim]"
    )
    if result.budget:
        console.print(_budget_line(result.budget))


def _budget_line(budget: dict) -> str:
    """The rotary budget in words (SPEC §17)."""
    variants = "; ".join(
        f"{v['variant']}: {v['pairs_beyond_trained_length']} of {budget['pairs']} pairs, longest "
        f"{v['longest_wavelength']:,.0f}"
        for v in budget["variants"]
    )
    return (
        f"rotary budget (Liu et al. 2023): critical dimension {budget['critical_dimension']} of "
        f"{budget['rotated_dims']} rotated dims (pairs below it complete a period within the trained length "
        f"{budget['trained_length']:,}), extrapolation limit {budget['extrapolation_limit']:,.0f} tokens (theta "
        f"{budget['rope_theta']:g}{_setting(budget)}); wavelengths past the trained length — {variants}"
    )


def _setting(budget: dict) -> str:
    """', the <layer type> setting' where the config has a rope setting per layer type, else ''."""
    return f", the {budget['layer_type']} setting" if budget.get("layer_type") else ""


def _config_only(model) -> bool:
    """True for a local folder with a config.json and no weights (no safetensors, pickle or GGUF file)."""
    from pathlib import Path

    if model is None:
        return False
    path = Path(model).expanduser()
    if not path.is_dir() or not (path / "config.json").is_file():
        return False
    patterns = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "*.gguf")
    return not any(any(path.glob(pattern)) for pattern in patterns)
