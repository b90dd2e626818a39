"""Command `states`: position in a model's hidden states on real texts (SPEC §16), or in a series of checkpoints.

`states --json` prints one object: `model`, `n_texts`, `max_length`, `n_layers`, `n_states` (L+1), `npz`
(arrays: `positional_vectors` (L+1, n, d), `positional_norms` (L+1, n), `positional_gram`, `probe_r2`,
`probe_r2_control`, `probe_mae`, `massive_max`, `massive_position`, `massive_channel`, `massive_ratio` (L+1,), ...),
the per-hidden-state lists `probe_r2`, `probe_r2_control`, `probe_mae`, `probe_mae_control`,
`positional_toeplitz_r2`, `positional_norm_mean` (and both `..._without_first`: over positions i >= 1, recentred
there), the references `probe_r2_control_std`, `positional_toeplitz_r2[_without_first]_null_mean` / `_null_std`,
`positional_positions_within_noise` and the scalars `probe_r2_baseline`, `probe_mae_baseline` (with
`baseline_inputs`: what the no-hidden-state baseline uses, ["first_token"] on a causal model, ["first_token",
"text_length"] on one that attends both ways), `massive_max`,
`massive_position`, `massive_channel`,
`massive_median`, `massive_ratio`, `massive_first_share`, `massive_special_share`, `massive_delimiter_share`
(null where undefined), `massive_top` (per hidden state, its top tokens), the settings (`min_texts`,
`n_positions_kept`, `n_tokens`, `probe_layers`, `probe_folds`, `probe_mae_sample`, `seed`, ...), `seconds` and
`figures`. With `--checkpoints`: `checkpoints` (label, model, revision, step, step_from), `steps`, each number as
(checkpoints, L+1) lists, `npz`, `figures` and `checkpoint_npz`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json, text_progress
from posprobe.cli.options import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_TEXT,
    AllowPickleOpt,
    BatchSizeOpt,
    ColumnOpt,
    DefaultTextOpt,
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
    parse_int_list,
)
from posprobe.formats.writing import default_out
from posprobe.pipelines.defaults import MIN_TEXTS, STATES_CONTROLS, STATES_MAE_SAMPLE, STATES_NULL_DRAWS, STATES_SEED


def register(app: typer.Typer) -> None:
    app.command(
        "states",
        short_help="Where position lives in the hidden states: positional vectors, probes, massive activations.",
    )(states)


def states(
    model: ModelArg = None,
    text: DefaultTextOpt = DEFAULT_TEXT,
    column: ColumnOpt = None,
    max_length: MaxLengthOpt = None,
    max_texts: MaxTextsOpt = None,
    batch_size: BatchSizeOpt = DEFAULT_BATCH_SIZE,
    min_texts: Annotated[
        int, typer.Option("--min-texts", help="Positional vectors at positions reached by at least this many texts.")
    ] = MIN_TEXTS,
    probe_layers: Annotated[
        str | None,
        typer.Option("--probe-layers", help="Hidden states to probe, e.g. 0,6,12 (default: all; -1 is the last)."),
    ] = None,
    mae_sample: Annotated[
        int, typer.Option("--mae-sample", help="Tokens the probe's mean absolute error is measured on (sampled).")
    ] = STATES_MAE_SAMPLE,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of the control permutations, the null and the MAE sample.")
    ] = STATES_SEED,
    null_draws: Annotated[
        int, typer.Option("--null-draws", help="Permutation-null draws of the Gram R² (0: none).")
    ] = STATES_NULL_DRAWS,
    controls: Annotated[
        int, typer.Option("--controls", help="Control permutation draws of the probe.")
    ] = STATES_CONTROLS,
    checkpoints: Annotated[
        str | None,
        typer.Option(
            "--checkpoints",
            help="A series instead of MODEL: folders, .gguf files or ID@REVISION separated by commas, or a training "
            "run folder (its checkpoint-* folders); ordered by step.",
        ),
    ] = None,
    revision: Annotated[str | None, typer.Option("--revision", help="Branch, tag or commit of a hub MODEL.")] = None,
    device: DeviceOpt = None,
    max_memory: MaxMemoryOpt = None,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
    edit: EditOpt = None,
) -> None:
    """Run MODEL on real texts and measure, for every hidden state (0 = embedding output): the positional vectors
    (mean hidden state per position, centred) and the Toeplitz R² of their Gram matrix; a ridge probe of the
    position (5 folds by text, held-out R² and MAE) with a permuted-position control; and the massive activations
    (largest |activation|, where, its ratio to the median, which tokens hold them). With --checkpoints: each
    number against the training step."""
    from posprobe.capture.textrun import check_run_settings
    from posprobe.cli.text_input import check_min_texts
    from posprobe.errors import PosprobeError
    from posprobe.texts.reading import check_texts, iter_texts
    from posprobe.validation import as_int

    max_length, max_texts, batch_size, _ = check_run_settings(
        max_length, max_texts, batch_size, device=device, max_memory=max_memory
    )
    min_texts = as_int(min_texts, "min_texts", minimum=1, hint="e.g. --min-texts 16")
    mae_sample = as_int(mae_sample, "mae_sample", minimum=1, maximum=2**24)
    seed = as_int(seed, "seed", minimum=0)
    null_draws = as_int(null_draws, "null_draws", minimum=0, maximum=1000)
    controls = as_int(controls, "controls", minimum=1, maximum=100)
    layers = parse_int_list(probe_layers, "probe-layers")
    if checkpoints is not None and (model is not None or revision is not None):
        raise PosprobeError(
            "--checkpoints replaces MODEL and --revision", "pass MODEL [--revision R], or --checkpoints A,B,... alone"
        )
    total = check_texts(text, column, max_texts)
    check_min_texts(min_texts, total, text, "the positional vectors")
    settings = dict(
        max_length=max_length,
        max_texts=max_texts,
        batch_size=batch_size,
        min_texts=min_texts,
        probe_layers=layers,
        mae_sample=mae_sample,
        seed=seed,
        null_draws=null_draws,
        controls=controls,
        device=device,
        max_memory=max_memory,
        allow_pickle=allow_pickle,
        text_source=str(text),
    )
    if checkpoints is not None:
        _series(checkpoints, text, column, total, settings, out, fmt, json_out)
        return
    from posprobe.checkpoint import resolve_model
    from posprobe.cli.attention import _check_writable

    source = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=True, revision=revision)
    from posprobe.capture.model import DEFAULT_MAX_LENGTH
    from posprobe.edits import prepare_edits

    edits = prepare_edits(edit, source.config, source.name, max_length or DEFAULT_MAX_LENGTH)
    out_dir = Path(out if out is not None else default_out("states", source.label)).expanduser()
    _check_writable(out_dir)
    from posprobe.pipelines.states import states as run_states
    from posprobe.pipelines.states_result import write_states

    with text_progress(total) as advance:
        result = run_states(source, iter_texts(text, column), progress=advance, edits=edits, **settings)
    from dataclasses import replace

    result = replace(result, model=source.name, revision=revision)
    written = write_states(result, out_dir, fmt.value)
    if json_out:
        emit_json(result.command_record(written))
        return
    _print(result, written)


def _series(checkpoints: str, text: str, column, total: int, settings: dict, out, fmt, json_out: bool) -> None:
    from posprobe.cli.attention import _check_writable
    from posprobe.pipelines.states_series import list_checkpoints, states_series, write_series
    from posprobe.texts.reading import iter_texts

    items = list_checkpoints(checkpoints)
    first = items[0].model if items[0].revision is not None else str(Path(items[0].model).parent.name or "series")
    out_dir = Path(out if out is not None else default_out("states-series", first)).expanduser()
    _check_writable(out_dir)
    with text_progress(total * len(items)) as advance:
        series = states_series(
            [c.model if c.revision is None else f"{c.model}@{c.revision}" for c in items],
            lambda: iter_texts(text, column),
            progress=advance,
            **settings,
        )
    written = write_series(series, out_dir, fmt.value)
    if json_out:
        emit_json(series.record(written["npz"], written["figures"], written["checkpoint_npz"]))
        return
    _print_series(series, written)


def _fmt(value, digits: int = 2) -> str:
    import numpy as np

    if value is None or not np.isfinite(value):
        return "—"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.{digits}f}"  # 28922, not 28921.9 folded at 80 columns


def _print(result, written) -> None:
    from rich.table import Table

    from posprobe.analysis.position_probe import N_FOLDS, baseline_words

    numbers = result.per_layer()
    m, p, v = result.massive, result.probes, result.vectors
    from rich import box

    table = Table(  # borderless: ten columns fit in 80
        title=f"Position in the hidden states — {result.model}, {result.n_texts} texts, max length "
        f"{result.max_length}, {v.n_kept} positions with ≥ {v.min_texts} texts",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 0, 0, 1),
    )
    for name in ("l", "R²", "ctrl", "±", "MAE", "VVᵀ", "null", "VVᵀ i≥1", "null", "noise"):
        table.add_column(name, justify="right", no_wrap=True)
    for layer in range(result.n_states):
        within = numbers["positional_positions_within_noise_without_first"][layer]
        table.add_row(
            str(layer),
            _fmt(numbers["probe_r2"][layer], 3),
            _fmt(numbers["probe_r2_control"][layer], 3),
            _fmt(numbers["probe_r2_control_std"][layer], 3),
            _fmt(numbers["probe_mae"][layer]),
            _fmt(numbers["positional_toeplitz_r2"][layer], 2),
            _null(numbers, "positional_toeplitz_r2", layer),
            _fmt(numbers["positional_toeplitz_r2_without_first"][layer], 2),
            _null(numbers, "positional_toeplitz_r2_without_first", layer),
            "—" if within != within else f"{int(within)}/{max(v.n_kept - 1, 0)}",
        )
    console.print(table)
    console.print(
        "[dim]l: hidden state (0 = embedding output); R²: held-out R² of a ridge probe of the position (5 folds "
        f"by text); ctrl ±: the same on positions permuted within each text, mean and sd over "
        f"{0 if p.r2_controls is None else p.r2_controls.shape[1]} permutations; MAE in positions (over "
        f"{p.n_sample} sampled tokens); VVᵀ: Toeplitz R² of the positional vectors' Gram matrix (i≥1: without the "
        "first token); null: its mean ± sd with positions 1.. permuted within each text (what any tokens give); "
        "noise: positions i ≥ 1 whose |v| (centred over i ≥ 1) is within 2 noise floors (sampling alone)[/dim]"
    )
    console.print(
        f"baseline (no hidden state: {baseline_words(p.baseline_inputs)}, same folds): R² "
        f"{_fmt(p.r2_baseline, 3)}, MAE {_fmt(p.mae_baseline)}; a probe R² at or below it reads nothing that "
        + (
            "the first-token flag (all a causal position sees without a hidden state: not the text's length) gives"
            if tuple(p.baseline_inputs) == ("first_token",)
            else "the text's shape gives"
        )
    )
    massive = Table(title="Massive activations", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    for name in ("l", "max|h|", "i,c", "token", "ratio", "|v| mean"):
        massive.add_column(name, justify="right", overflow="fold", min_width=len(name))
    for layer in range(result.n_states):
        token = result.top_tokens[layer][0] if result.top_tokens is not None else str(int(m.top_token[layer, 0]))
        token = token if len(token) <= 12 else token[:11] + "…"  # the full tokens: --json
        massive.add_row(
            str(layer),
            _fmt(m.max[layer], 1),
            f"{int(m.position[layer])},{int(m.channel[layer])}",
            token,
            _fmt(m.ratio[layer], 0),
            _fmt(numbers["positional_norm_mean"][layer]),
        )
    console.print(massive)
    console.print(
        "[dim]max|h| at position i, channel c, on token; ratio: max|h| / median |h|; |v| mean: the positional "
        "vectors' mean norm[/dim]"
    )
    if result.n_texts < N_FOLDS:
        console.print(
            f"[dim]R², ctrl, MAE: — (undefined): the probe holds out each of {N_FOLDS} folds of texts in turn, and "
            f"{result.n_texts} texts leave a fold empty; pass at least {N_FOLDS} texts[/dim]"
        )
    console.print(f"arrays:  {written['npz']}\nfigures: {Path(written['npz']).parent}")


def _null(numbers: dict, name: str, layer: int) -> str:
    """'mean±sd' of the permutation null of `name` at `layer`, or '—'."""
    mean, sd = numbers[f"{name}_null_mean"][layer], numbers[f"{name}_null_std"][layer]
    if mean != mean:
        return "—"
    return f"{mean:.2f}" + ("" if sd != sd else f"±{sd:.2f}")


def _print_series(series, written) -> None:
    import numpy as np
    from rich.table import Table

    numbers = series.numbers
    table = Table(title=f"Position in the hidden states over checkpoints — {series.title}", title_justify="left")
    for name in ("checkpoint", "step", "R² l=0", "R² last", "ctrl max", "VVᵀ mean", "ratio max"):
        table.add_column(name, justify="right", overflow="fold")
    for c, (checkpoint, step) in enumerate(zip(series.checkpoints, series.steps)):
        r2_vv = numbers["positional_toeplitz_r2"][c]
        table.add_row(
            checkpoint.label,
            str(int(step)) if series.ordered_by_step else "—",
            _fmt(numbers["probe_r2"][c, 0], 3),
            _fmt(numbers["probe_r2"][c, -1], 3),
            _fmt(np.nanmax(numbers["probe_r2_control"][c]) if np.isfinite(numbers["probe_r2_control"][c]).any()
                 else None, 3),
            _fmt(np.nanmean(r2_vv) if np.isfinite(r2_vv).any() else None, 3),
            _fmt(np.nanmax(numbers["massive_ratio"][c]) if np.isfinite(numbers["massive_ratio"][c]).any() else None,
                 0),
        )  # fmt: skip
    console.print(table)
    console.print(
        "[dim]R²: held-out R² of the position probe at the first and last hidden state; ctrl max: the largest "
        "control R²; VVᵀ mean: mean Toeplitz R² of the positional vectors' Gram matrices; ratio max: the largest "
        "max|h| / median |h|[/dim]"
    )
    console.print(f"arrays:  {written['npz']}\nfigure:  {written['figures'][0]}")
