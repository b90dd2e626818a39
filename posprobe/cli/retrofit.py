"""`posprobe retrofit`: install a positional mechanism into a pretrained encoder and save the result.

Importing this module stays light (no torch): the mechanism names shown in `--help` are a constant that a
test keeps equal to `posprobe.mechanisms.REGISTRY`, which is what the command validates against.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from posprobe.cli.console import console, emit_json
from posprobe.cli.options import AllowPickleOpt, JsonOpt, ModelArg
from posprobe.errors import PosprobeError

KNOWN_MECHANISMS = (
    "tisa",
    "fixed",
    "dynamic",
    "composite",
    "key-dynamic",
    "shaw-values",
    "depthwise",
    "conv-qkv",
    "cat",
)
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "spiece.model",
    "sentencepiece.bpe.model",
)

MechanismOpt = Annotated[
    str, typer.Option("--mechanism", "-m", help=f"One of: {', '.join(KNOWN_MECHANISMS)}.", show_default=False)
]
RetrofitOutOpt = Annotated[
    Path, typer.Option("--out", help="Folder to write (must not exist or be empty).", show_default=False)
]
RadiusOpt = Annotated[int, typer.Option("--radius", help="Clip radius r (kernel size 2r+1).")]
KernelsOpt = Annotated[int, typer.Option("--kernels", help="TISA: number of Gaussian kernels S per head.")]
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


def _check_out(out: Path) -> Path:
    out = out.expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PosprobeError(
            f"output '{out}' already exists and is not an empty folder",
            "choose a new --out folder (nothing is overwritten)",
        )
    return out


def _write_atomically(model, source_path: Path, out: Path) -> None:
    """Save into a temporary sibling of `out`, then rename it, so a failure leaves nothing half-written."""
    from posprobe.retrofit import save_retrofitted

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700 folders; give the usual permissions
    except OSError as err:
        raise PosprobeError(f"cannot write next to '{out}' ({err.strerror or err})", "choose a writable --out") from err
    try:
        save_retrofitted(model, tmp)
        for file in tmp.iterdir():
            os.chmod(file, 0o666 & ~_umask())
        for name in _TOKENIZER_FILES:
            if (source_path / name).is_file():
                shutil.copy2(source_path / name, tmp / name)
        if out.exists():
            out.rmdir()  # checked empty above
        os.replace(tmp, out)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PosprobeError(
            f"cannot write '{out}' ({err.strerror or err})", "check free space and permissions"
        ) from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def retrofit_command(
    model: ModelArg = None,
    mechanism: MechanismOpt = ...,
    out: RetrofitOutOpt = ...,
    radius: RadiusOpt = 8,
    kernels: KernelsOpt = 5,
    init: InitOpt = "zero",
    drop_position_embeddings: DropOpt = False,
    seed: SeedOpt = 0,
    allow_pickle: AllowPickleOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Retrofit a positional mechanism (TISA, lightweight convolutions, CAT, ...) into MODEL and save it."""
    from posprobe.mechanisms import REGISTRY

    if mechanism not in REGISTRY:
        raise PosprobeError(f"unknown mechanism '{mechanism}'", f"choose one of: {', '.join(REGISTRY)}")
    out = _check_out(out)

    from transformers.utils import logging as hf_logging

    from posprobe.checkpoint import resolve_model
    from posprobe.retrofit import added_parameters, load_model, retrofit

    hf_logging.disable_progress_bar()

    source = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=True)
    with console.status(f"loading {source.name}"):
        net = load_model(source.path, _saved_class(source.config), allow_pickle=allow_pickle)
    with tempfile.TemporaryDirectory(prefix="posprobe-fit-") as tmp:
        if init == "fit":  # the TISA paper's initialisation: kernels fitted to this model's own profiles
            from posprobe.pipelines.fitting import fit_kernels_file

            with console.status(f"fitting TISA kernels to {source.name}"):
                init = f"fit:{fit_kernels_file(str(source.path), kernels, tmp, allow_pickle)}"
        retrofit(
            net,
            mechanism,
            radius=radius,
            kernels=kernels,
            init=init,
            drop_position_embeddings=drop_position_embeddings,
            seed=seed,
        )
    count = added_parameters(net)
    with console.status(f"writing {out}"):
        _write_atomically(net, source.path, out)
    spec = dict(net.config.posprobe)
    if json_output:
        emit_json(
            {
                "mechanism": mechanism,
                "added_parameters": count,
                "out": str(out),
                "model": source.name,
                "radius": spec["radius"],
                "kernels": spec["kernels"],
                "init": init,
                "drop_position_embeddings": drop_position_embeddings,
            }
        )
    else:
        console.print(f"retrofitted [bold]{mechanism}[/bold] into {source.name}: {count:,} added parameters -> {out}")


def register(app: typer.Typer) -> None:
    app.command("retrofit")(retrofit_command)


def _saved_class(config: dict):
    """The transformers class the checkpoint was saved from (config.json `architectures`), so that a task
    head (e.g. a fine-tuned classifier) is kept; None (= AutoModel) when it names no transformers class."""
    import transformers

    names = config.get("architectures") or []
    cls = getattr(transformers, str(names[0]), None) if names else None
    return cls if isinstance(cls, type) and hasattr(cls, "from_pretrained") else None
