"""`posprobe retrofit`: install a positional mechanism into a pretrained encoder and save the result.

Importing this module stays light (no torch): mechanism names and summaries come from the torch-free
`posprobe.mechanisms.catalogue`. Every setting is validated (`check_settings`) before the model is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json, log_console
from posprobe.cli.options import AllowPickleOpt, JsonOpt, ModelArg
from posprobe.formats.writing import default_out
from posprobe.mechanisms.catalogue import DEFAULT_KERNELS, DEFAULT_RADIUS, MECHANISM_NAMES

MechanismOpt = Annotated[
    str, typer.Option("--mechanism", "-m", help=f"One of: {', '.join(MECHANISM_NAMES)}.", show_default=False)
]
RetrofitOutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="Folder to write (must not exist or be empty; default: <model>-<mechanism> in posprobe-out/retrofit).",
        show_default=False,
    ),
]
RadiusOpt = Annotated[
    int | None,
    typer.Option("--radius", help=f"Clip radius r (kernel size 2r+1); default {DEFAULT_RADIUS}.", show_default=False),
]
KernelsOpt = Annotated[
    int | None,
    typer.Option(
        "--kernels",
        help=f"TISA: Gaussian kernels S per head; default {DEFAULT_KERNELS}, or the S of a fit:FILE.",
        show_default=False,
    ),
]
InitOpt = Annotated[
    str,
    typer.Option(
        "--init",
        help="zero (outputs unchanged), random, fit (TISA: fit kernels to this model's profiles), or fit:FILE.",
    ),
]
DropOpt = Annotated[
    bool,
    typer.Option(
        "--drop-position-embeddings", help="Replace every position embedding by their average (TISA replace mode)."
    ),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for --init random.")]


def retrofit_command(
    model: ModelArg = None,
    mechanism: MechanismOpt = ...,
    out: RetrofitOutOpt = None,
    radius: RadiusOpt = None,
    kernels: KernelsOpt = None,
    init: InitOpt = "zero",
    drop_position_embeddings: DropOpt = False,
    seed: SeedOpt = 0,
    allow_pickle: AllowPickleOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Retrofit a positional mechanism (TISA, lightweight convolutions, CAT, ...) into MODEL and save it."""
    import tempfile
    import warnings

    from posprobe.checkpoint import resolve_model
    from posprobe.errors import PosprobeError, PosprobeWarning
    from posprobe.mechanisms.catalogue import check_settings

    settings = check_settings(mechanism, radius=radius, kernels=kernels, init=init)  # before any model is loaded
    source = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=True)
    from posprobe.mechanisms.catalogue import check_retrofittable

    check_retrofittable(source.config)  # a family retrofit cannot use is refused before its weights are read
    out = (out if out is not None else default_out("retrofit", f"{source.label}-{settings.mechanism}")).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PosprobeError(
            f"output '{out}' already exists and is not an empty folder",
            "choose a new --out folder (nothing is overwritten)",
        )

    from transformers.utils import logging as hf_logging

    from posprobe.retrofitting.install import added_parameters, retrofit, save_retrofitted, saved_model_class
    from posprobe.retrofitting.loading import load_model

    hf_logging.disable_progress_bar()
    with log_console.status(f"loading {source.name}"):
        net = load_model(source.path, saved_model_class(source.config), allow_pickle=allow_pickle)
    fitted_here = settings.init.kind == "fit" and settings.init.path is None
    with tempfile.TemporaryDirectory(prefix="posprobe-fit-") as tmp:
        if fitted_here:
            # the TISA paper's initialisation: kernels fitted to this model's own profiles
            from posprobe.pipelines.fitting import fit_kernels_file

            with log_console.status(f"fitting S={settings.kernels} TISA kernels to {source.name}"):
                init = f"fit:{fit_kernels_file(str(source.path), settings.kernels, tmp, allow_pickle)}"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PosprobeWarning)
            retrofit(
                net,
                settings.mechanism,
                radius=radius,
                kernels=kernels,
                init=init,
                drop_position_embeddings=drop_position_embeddings,
                seed=seed,
            )
    if fitted_here:  # the kernels file was temporary: record what made the fit, not a path that is gone
        recipe = net.config.posprobe
        recipe["init"] = init = "fit"
        recipe["init_fit"] = {"kernels_file": None} | {
            k: v for k, v in recipe["init_fit"].items() if k != "kernels_file"
        }
    notes = [str(w.message) for w in caught if issubclass(w.category, PosprobeWarning)]
    count = added_parameters(net)
    with log_console.status(f"writing {out}"):
        save_retrofitted(net, out, tokenizer_from=source.path)
    spec = dict(net.config.posprobe)
    if json_output:
        emit_json(
            {
                "mechanism": settings.mechanism,
                "added_parameters": count,
                "parameters_per_layer": settings.info.formula,
                "out": str(out),
                "model": source.name,
                "radius": spec["radius"],
                "kernels": spec["kernels"],
                "init": init,
                "init_fit": spec.get("init_fit"),
                "drop_position_embeddings": drop_position_embeddings,
                "notes": notes,
            }
        )
    else:
        console.print(
            f"retrofitted [bold]{settings.mechanism}[/bold] into {source.name}: {count:,} added parameters "
            f"({settings.info.formula} per layer) -> {out}"
        )
        if kernels is None and settings.kernels_file is not None:
            console.print(f"[dim]S = {settings.kernels} kernels per head, from {settings.init.path}[/dim]")
        for note in notes:
            console.print(f"note: {note}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("retrofit")(retrofit_command)
