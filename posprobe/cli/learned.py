"""`posprobe learned DIR`: the positional functions a retrofitted (and fine-tuned) model learned (SPEC §11). The
old spelling `posprobe kernels` still works, a hidden alias.

`--json` prints one object: {"model", "mechanism", "parts", "convention": "k = j - i", "window", "radius",
"initial_known", "text_tokens", "compare", "profiles", "npz", "figures", "notes",
"arrays": {name: {"shape", "max_abs", "max_abs_change", ["profile_correlation" (L x H)],
["compare_correlation" (L x H)]}}}. The npz holds `offsets` (K,) and every array (see
`posprobe.analysis.learned`: `functions` / `initial` `(L, H, K)` for score-bias mechanisms): `learned_functions.npz`
in `--out` (default `posprobe-out/learned/<folder>`; named `kernels.npz` in `posprobe-out/kernels/` before: the
learned functions are not TISA's kernels except for TISA).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json, log_console
from posprobe.cli.options import AllowPickleOpt, FigureFormat, FormatOpt, JsonOpt, OutOpt
from posprobe.formats.writing import default_out


def register(app: typer.Typer) -> None:
    app.command("learned")(learned)
    app.command("kernels", hidden=True)(learned)  # the old name; "kernels" alone now means TISA's Gaussian kernels


def learned(
    folder: Annotated[Path, typer.Argument(help="A folder written by `posprobe retrofit` or `posprobe finetune`.")],
    window: Annotated[
        int | None, typer.Option("--window", help="Show k = -W..W (default 16 for TISA, else the clip radius r).")
    ] = None,
    text: Annotated[
        Path | None,
        typer.Option("--text", help="Text file (one text per line): dynamic tables scored by the average query/key."),
    ] = None,
    compare: Annotated[
        Path | None, typer.Option("--compare", help="A second retrofitted folder (same mechanism), side by side.")
    ] = None,
    profiles: Annotated[
        str | None,
        typer.Option("--profiles", help="Base model (or its `posprobe profiles` .npz): correlation per head."),
    ] = None,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
) -> None:
    """Show what a retrofitted model's positional mechanism learned, per layer and head, over k = j − i."""
    from posprobe.pipelines.learned import _check_folder, check_window, read_learned, summary, write_learned

    check_window(window)
    path, _ = _check_folder(folder)
    out_dir = out if out is not None else default_out("learned", path.resolve().name)
    with log_console.status(f"reading {folder}"):
        report = read_learned(
            folder, window=window, text=text, compare=compare, profiles=profiles, allow_pickle=allow_pickle
        )
        written = write_learned(report, out_dir, fmt.value)
    functions = report.learned
    if json_out:
        from posprobe.pipelines.learned import metadata

        meta = metadata(report)
        meta.pop("shapes")
        emit_json(
            {
                **meta,
                "text_tokens": report.n_text_tokens,
                "npz": str(written["npz"]),
                "figures": [str(p) for p in written["figures"]],
                "notes": report.notes,
                "arrays": summary(report),
            }
        )
        return
    from rich.table import Table

    rows = summary(report)
    table = Table(title=f"{report.model}: {functions.mechanism}, k = j − i in ±{report.window}", title_justify="left")
    for name in ("array", "shape", "max |value|", "max |change from init|"):
        table.add_column(name, justify="left" if name == "array" else "right")
    for key, row in rows.items():
        change = row["max_abs_change"]
        table.add_row(
            key,
            "×".join(map(str, row["shape"])),
            f"{row['max_abs']:.4g}",
            "unknown" if change is None else f"{change:.4g}",
        )
    console.print(table)
    _print_correlations(rows)
    for note in report.notes:
        console.print(f"[dim]{note}[/dim]")
    console.print(f"npz: {written['npz']}")
    for path in written["figures"]:
        console.print(f"figure: {path}")


def _print_correlations(rows: dict) -> None:
    """The correlations asked for (--profiles, --compare) as a table: per array, median, min and max over layers and
    heads (per layer and head: --json, learned_functions.npz)."""
    import numpy as np
    from rich.table import Table

    asked = [(k, w) for k, w in (("profile_correlation", "profiles"), ("compare_correlation", "compared")) if any(
        k in row for row in rows.values())]  # fmt: skip
    if not asked:
        return
    table = Table(title="Pearson r per head over the shared offsets", title_justify="left")
    for name in ("array", "with", "median", "min", "max"):
        table.add_column(name, justify="left" if name in ("array", "with") else "right", no_wrap=True)
    for key, row in rows.items():
        for name, who in asked:
            values = np.array([[np.nan if x is None else x for x in r] for r in row.get(name) or []], dtype=float)
            values = values[np.isfinite(values)]
            cells = ["—"] * 3 if values.size == 0 else [f"{f(values):.2f}" for f in (np.median, np.min, np.max)]
            table.add_row(key, who, *cells)
    console.print(table)
    console.print(
        "[dim]profiles: with the base model's profiles (--profiles); compared: with the model of --compare; over "
        "layers and heads (per layer and head: --json and learned_functions.npz)[/dim]"
    )
