"""Command `attention`: empirical positional profiles of a model on real texts (SPEC §10).

`attention --json` prints one object: `model`, `n_texts`, `max_length`, `npz` (arrays: `score_profiles`,
`prob_profiles` (L, H, 2n-1), `offsets`, `pair_counts` (2n-1), `mean_distance`, `toeplitz_r2` (L, H),
`weights_correlation` (L, H) where defined, `mean_scores` (L, H, n, n) and `count_matrix` (n, n) where kept, the
sink arrays, ...), `mean_distance`, `toeplitz_r2` (nulls where the mean score matrix was not kept),
`weights_correlation` (null where undefined, or null as a whole), the attention sinks (SPEC §14):
`first_token_mass`, `special_token_mass`, `distance_without_first` (L, H), `sink_rate`, `uniform_distance`,
`uniform_distance_without_first` (L,), `sink_threshold`, `n_sink_queries`, `n_special_tokens`; plus `model_type`,
`n_layers`, `n_heads`, `exclude_special`, `causal`, `text`, `n_queries`, `n_pairs`, `weights_profile`,
`weights_correlation_min_pairs` (offsets with fewer pairs are left out of `weights_correlation`), `stack`
('encoder' for an encoder-decoder, whose encoder runs on the texts; else null), `mean_scores` ('kept', or why
not: `--mean-scores auto|yes|no`; by default kept where its n x n sums take at most 512 MiB), `seconds`,
`figures`. Long texts are computed in blocks of query rows (SPEC §19; `--block-size`), memory linear in n.
Models with learned per-head sinks (gpt-oss) add `learned_sink_share` and `real_token_share` (L, H: the sink
logit's own share of each query's attention, the share left to real tokens) and `learned_sink_queries`; DeepSeek V4's
compressed layers count the share of their entries pooled over blocks of tokens in `learned_sink_share`.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json
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
    MaxMemoryOpt,
    MaxTextsOpt,
    ModelArg,
    OutOpt,
    Stack,
    StackOpt,
)
from posprobe.formats.writing import default_out
from posprobe.pipelines.defaults import ATTENTION_MIN_PAIRS, ATTENTION_WINDOW


class MeanScores(str, Enum):
    auto = "auto"  # kept where its n x n sums take at most 512 MiB
    yes = "yes"
    no = "no"


def register(app: typer.Typer) -> None:
    app.command("attention", short_help="Attention profiles, distances and sinks on real texts, per layer and head.")(
        attention
    )


def _check_writable(out: Path) -> None:
    """Fail before the run if `out` cannot be written, without creating it (an interrupted run leaves nothing)."""
    from posprobe.errors import PosprobeError
    from posprobe.formats.writing import prepare_out_dir

    if out.exists():
        prepare_out_dir(out)
        return
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise PosprobeError(
            f"cannot create output folder '{out}' (in '{parent}')", "choose a writable folder with --out"
        )


def attention(
    model: ModelArg = None,
    text: DefaultTextOpt = DEFAULT_TEXT,
    column: ColumnOpt = None,
    max_length: Annotated[
        int | None,
        typer.Option("--max-length", help="Tokens per text (truncated), n of the profiles; default 128 or fewer."),
    ] = None,
    max_texts: MaxTextsOpt = None,
    batch_size: BatchSizeOpt = DEFAULT_BATCH_SIZE,
    exclude_special: Annotated[
        bool, typer.Option("--exclude-special", help="Drop special tokens ([CLS], [SEP], ...) as queries and keys.")
    ] = False,
    min_pairs: Annotated[
        int,
        typer.Option("--min-pairs", help="Offsets with fewer pairs are left out of the weights correlation."),
    ] = ATTENTION_MIN_PAIRS,
    window: Annotated[
        int, typer.Option("--window", help="Figures show k = -W..W (a causal model: -W..0).")
    ] = ATTENTION_WINDOW,
    mean_scores: Annotated[
        MeanScores,
        typer.Option(
            "--mean-scores",
            help="Keep the n x n mean score matrix, its counts and Toeplitz R² (auto: where they take at most "
            "512 MiB).",
        ),
    ] = MeanScores.auto,
    block_size: Annotated[
        int | None,
        typer.Option(
            "--block-size",
            help="Query rows per block on the blockwise route (0: whole matrices; default: blocks where whole "
            "matrices would take 256 MiB or more).",
        ),
    ] = None,
    stack: StackOpt = Stack.encoder,
    device: DeviceOpt = None,
    max_memory: MaxMemoryOpt = None,
    out: OutOpt = None,
    fmt: FormatOpt = FigureFormat.png,
    json_out: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
    edit: EditOpt = None,
) -> None:
    """Run MODEL on real texts and measure, per layer and head, the score and probability profiles over
    k = j − i, the mean attention distance (and what uniform attention would give), the mean score matrix's
    Toeplitz R², its correlation with the weights-based profile, and the attention sinks (first-token and
    special-token mass, sink rate). A hybrid's attention layers are measured; its recurrent / convolution layers are
    listed with their kind and no positional score."""
    from posprobe.capture.textrun import check_run_settings
    from posprobe.checkpoint import resolve_model
    from posprobe.pipelines.attention import attention_profiles, write_attention
    from posprobe.texts.reading import check_texts, iter_texts
    from posprobe.validation import as_int

    max_length, max_texts, batch_size, _ = check_run_settings(
        max_length, max_texts, batch_size, device=device, max_memory=max_memory
    )
    window = as_int(window, "window", minimum=1)
    min_pairs = as_int(min_pairs, "min_pairs", minimum=1)
    if block_size is not None:
        block_size = as_int(block_size, "block_size", minimum=0, hint="e.g. --block-size 256, or 0 for whole matrices")
    total = check_texts(text, column, max_texts)
    source = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=True)
    from posprobe.capture.model import DEFAULT_MAX_LENGTH
    from posprobe.edits import prepare_edits

    edits = prepare_edits(edit, source.config, source.name, max_length or DEFAULT_MAX_LENGTH)
    out_dir = Path(out if out is not None else default_out("attention", source.label)).expanduser()
    _check_writable(out_dir)

    from posprobe.cli.console import text_progress

    with text_progress(total) as advance:
        result = attention_profiles(
            source,  # resolved once, here: the pipeline loads it without resolving it again
            iter_texts(text, column),
            max_length=max_length,
            max_texts=max_texts,
            batch_size=batch_size,
            exclude_special=exclude_special,
            min_pairs=min_pairs,
            device=device,
            max_memory=max_memory,
            allow_pickle=allow_pickle,
            progress=advance,
            text_source=str(text),
            stack=stack.value,
            mean_scores={"auto": None, "yes": True, "no": False}[mean_scores.value],
            block_size=block_size,
            edits=edits,
        )
    from dataclasses import replace

    result = replace(result, model=source.name)
    written = write_attention(result, out_dir, fmt.value, window=window)
    if json_out:
        emit_json(result.command_record(written))
        return
    _print(result, written)


def _print(result, written) -> None:
    title = (
        f"Mean attention distance (tokens) — {result.model}, {result.n_texts} texts, max length "
        f"{result.max_length}{', causal' if result.causal else ''}"
    )
    # a column per layer while the table fits the terminal (8 layers at 80 columns), else a row per layer
    if 12 + 8 * result.n_layers <= max(console.width, 80):
        table = _heads_by_layers(result, title)
    else:
        table = _layers_summary(result, title)
    console.print(table)
    console.print(
        "[dim]R² M: median over heads of the mean score matrix's Toeplitz R²; r weights: median Pearson r between "
        f"s(k) and the weights-based profile ({result.weights_note}) over the offsets with at least "
        f"{result.min_pairs} pairs[/dim]"
    )
    _print_layer_kinds(result)
    if not result.present_heads.all():  # SPEC §9: Laguna's layers of fewer query heads
        console.print("[dim]—: no such head (the layer has fewer query heads than the model's most)[/dim]")
    _print_sinks(result)
    _print_learned_sinks(result)
    console.print(f"arrays:  {written['npz']}\nfigures: {Path(written['npz']).parent}")


def _print_layer_kinds(result) -> None:
    """One line per layer that does not attend globally with its position term: a local window, chunks, NoPE, or a
    hybrid's layer without softmax attention (its cells above are '—': no positional score)."""
    from rich.markup import escape

    for layer, kind in enumerate(result.layer_kinds or []):
        if kind != "global":
            console.print(f"[dim]layer {layer}: {escape(kind)}[/dim]")


def _heads_by_layers(result, title: str):
    """Every head's mean distance: a row per head, a column per layer, the layer medians below."""
    import numpy as np
    from rich.table import Table

    p = result.profiles
    table = Table(title=title, title_justify="left")
    table.add_column("head", justify="right")
    for layer in range(result.n_layers):
        table.add_column(f"L{layer}", justify="right")
    for h in range(result.n_heads):
        table.add_row(f"h{h}", *[_num(v) for v in p.mean_distance[:, h]])
    medians = lambda per_layer: [_num(_over_heads(np.nanmedian, row)) for row in per_layer]  # noqa: E731
    table.add_row("R² M", *medians(result.toeplitz_r2), style="bold")
    if result.weights_correlation is not None:
        table.add_row("r weights", *medians(result.weights_correlation), style="bold")
    return table


def _layers_summary(result, title: str):
    """Too many layers for a column each (SmolLM2's 30 made 30 empty columns at 80): a row per layer with the
    median, smallest and largest distance over its heads (every head's in mean_distance.png and --json)."""
    import numpy as np
    from rich.table import Table

    p = result.profiles
    table = Table(title=title + " — over heads; each head in mean_distance.png", title_justify="left")
    names = ["layer", "median", "min", "max", "R² M"] + (
        ["r weights"] if result.weights_correlation is not None else []
    )
    for name in names:
        table.add_column(name, justify="right")
    for layer, row in enumerate(p.mean_distance):
        cells = [_num(_over_heads(f, row)) for f in (np.nanmedian, np.nanmin, np.nanmax)]
        cells.append(_num(_over_heads(np.nanmedian, result.toeplitz_r2[layer])))
        if result.weights_correlation is not None:
            cells.append(_num(_over_heads(np.nanmedian, result.weights_correlation[layer])))
        table.add_row(f"L{layer}", *cells)
    return table


def _num(value: float) -> str:
    """A table cell: two decimals, or '—' where undefined."""
    import numpy as np

    return "—" if not np.isfinite(value) else f"{value:.2f}"


def _over_heads(reduce, row) -> float:
    """`reduce` (np.nanmedian, np.nanmin, ...) of a layer's per-head values; NaN where no head has one."""
    import numpy as np

    return float(reduce(row)) if np.isfinite(row).any() else float("nan")


def _print_sinks(result) -> None:
    """One row per layer: distances against the uniform-attention reference, the sink masses, the sink rate."""
    import numpy as np
    from rich.table import Table

    s, p = result.sinks, result.profiles
    table = Table(
        title="Attention sinks per layer (means over heads; queries i ≥ 1 for the masses)", title_justify="left"
    )
    names = ("layer", "dist", "uniform", "dist w/o 1st", "uniform w/o 1st", "1st mass", "uniform 1st", "special")
    for name in (*names, "sink rate"):
        table.add_column(name, justify="right")
    from posprobe.analysis.sinks import per_layer  # references kept per head: their means over heads

    uniform_first = per_layer(s.uniform_first_token_mass)
    if uniform_first is None:
        uniform_first = np.full(result.n_layers, np.nan)
    uniform, uniform_later = per_layer(s.uniform_distance), per_layer(s.uniform_distance_without_first)
    for layer in range(result.n_layers):
        table.add_row(
            f"L{layer}",
            _num(_over_heads(np.nanmean, p.mean_distance[layer])),
            _num(uniform[layer]),
            _num(_over_heads(np.nanmean, s.distance_without_first[layer])),
            _num(uniform_later[layer]),
            _num(_over_heads(np.nanmean, s.first_token_mass[layer])),
            _num(uniform_first[layer]),
            _num(_over_heads(np.nanmean, s.special_token_mass[layer])),
            _num(s.sink_rate[layer]),
        )
    console.print(table)
    console.print(
        "[dim]dist: mean attention distance (tokens); uniform: the same if every query attended uniformly over the "
        f"keys it may see; 1st mass: attention on the first token; sink rate: share of heads with 1st mass > "
        f"{s.threshold:g}[/dim]"
    )
    if s.n_special_tokens == 0:
        console.print("[dim]special: — (the texts hold no special token: the tokenizer adds none)[/dim]")


def _print_learned_sinks(result) -> None:
    """Models with learned sink logits (gpt-oss): per layer, the sink's own share and the share left to real
    tokens (means over heads and real queries)."""
    import numpy as np
    from rich.table import Table

    shares = result.learned_sinks
    if shares is None:
        return
    table = Table(title="Learned sinks per layer (means over heads and real queries)", title_justify="left")
    for name in ("layer", "sink share", "real tokens", "max head sink share"):
        table.add_column(name, justify="right")
    for layer in range(result.n_layers):
        row = shares.learned_sink_share[layer]
        table.add_row(
            f"L{layer}",
            _num(_over_heads(np.nanmean, row)),
            _num(_over_heads(np.nanmean, shares.real_token_share[layer])),
            _num(_over_heads(np.nanmax, row)),
        )
    console.print(table)
    console.print(
        "[dim]sink share: the attention each head's learned sink logit takes (no token, no value), with that of "
        "entries pooled over blocks of tokens where a layer adds them; the profiles' probabilities are the real "
        "tokens' share[/dim]"
    )
