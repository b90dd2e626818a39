"""Sections run through the library: the pipeline function its command calls, `result.save(folder)` and the record
the command prints with `--json` (built from `result.to_dict()` and the saved paths as the command builds it), with
no command line parsed and no stdout read.

`RUNS[command](call) -> record` where `call` (`SectionCall`) holds the model, the section's own arguments as the
reproducing command spells them (`options`: '--lengths 256,512' -> {'lengths': '256,512'}), the report's texts
and the section's folder. A command that is not in `RUNS` runs through `run.command_runner` (the CLI's own
command, in this process), as every section did before; tests/test_report_loads.py checks that each section's
record equals its reproducing command's, run alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class SectionCall:
    """What a section runs: the `model` and `allow_pickle` of the report, the section's `options` (its arguments
    after the model, by option name without '--', values as typed), the texts (`text`, `column`, `max_texts`; None
    for a section without texts) and the `folder` it writes into (the command's `--out`)."""

    model: str
    allow_pickle: bool
    options: dict
    folder: Path
    text: str | None = None
    column: str | None = None
    max_texts: int | None = None

    def source(self, with_tokenizer: bool = False):
        from posprobe.checkpoint import resolve_model

        return resolve_model(self.model, allow_pickle=self.allow_pickle, with_tokenizer=with_tokenizer)

    def out_dir(self) -> Path:
        from posprobe.formats.writing import prepare_out_dir

        return prepare_out_dir(self.folder)


def options_of(args: list[str]) -> dict:
    """{'lengths': '256,512', 'windows': '2'} of ['--lengths', '256,512', '--windows', '2'] (a flag: True)."""
    out, i = {}, 0
    while i < len(args):
        name = args[i].removeprefix("--").replace("-", "_")
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[name], i = args[i + 1], i + 2
        else:
            out[name], i = True, i + 1
    return out


def _layers(value: str | None):
    """A `--layers` value as the pipelines take it: 'all' (or None) as it is, else the list of ints."""
    return value if value in (None, "all") else [int(part) for part in value.split(",")]


def _paths(paths) -> list[str]:
    return [str(p) for p in paths]


def _toeplitz(call: SectionCall) -> dict:
    from posprobe.pipelines.weights import toeplitz

    source = call.source()
    out_dir = call.out_dir()
    return toeplitz(None, blocks=None, cosine=False, source=source).save(out_dir).record


def _fhat(call: SectionCall) -> dict:
    from posprobe.pipelines.weights import fhat

    source = call.source()
    out_dir = call.out_dir()
    return fhat(None, int(call.options.get("layer", 0)), "paper", source=source).save(out_dir).record


def _rotary(call: SectionCall) -> dict:
    from posprobe.pipelines.rotary import rotary

    rope_scaling = call.options.get("rope_scaling", "none")
    source = call.source()
    out_dir = call.out_dir()
    result = rotary(None, _layers(call.options.get("layers", "all")), source=source, rope_scaling=rope_scaling)
    saved = result.save(out_dir)
    return result.to_dict() | {"npz": str(saved["npz"]), "figure": str(saved["figures"][0])}


def _context(call: SectionCall) -> dict:
    from posprobe.families.rope_variants import parse_variants
    from posprobe.pipelines.context import check_family, check_lengths, context
    from posprobe.texts.reading import check_texts, iter_texts

    lengths = check_lengths(call.options["lengths"])
    rope_scaling = call.options.get("rope_scaling", "none")
    variants = parse_variants(rope_scaling)
    text = call.options.get("text", "builtin:kjv")  # the command's default
    check_texts(text, None, 1)
    source = call.source(with_tokenizer=True)
    check_family(source, variants, lengths)
    result = context(None, lengths, texts=iter_texts(text, None), windows=int(call.options.get("windows", 4)),
                     rope_scaling=rope_scaling, allow_pickle=call.allow_pickle, source=source,
                     device=call.options.get("device"))  # fmt: skip
    result = replace(result, text={"source": text, **result.text})
    saved = result.save(call.out_dir())
    paths = {"npz": str(saved["npz"]), "json": str(saved["json"]), "figures": _paths(saved["figures"])}
    return result.to_dict() | paths


def _needle(call: SectionCall) -> dict:
    from posprobe.pipelines.needle import NeedleGrid, needle

    o = call.options
    grid = NeedleGrid(lengths=[int(x) for x in o["lengths"].split(",")],
                      depths=[float(x) for x in o["depths"].split(",")], trials=int(o.get("trials", 3)),
                      beyond_window=bool(o.get("beyond_window", False)))  # fmt: skip
    source = call.source(with_tokenizer=True)
    out_dir = call.out_dir()
    result = needle(None, haystack=o.get("haystack", "builtin:kjv"), grid=grid, allow_pickle=call.allow_pickle,
                    source=source, device=o.get("device"))  # fmt: skip
    saved = result.save(out_dir)
    return result.to_dict() | {"files": {name.split(".")[0]: str(path) for name, path in saved.paths.items()}}


def _texts(call: SectionCall):
    """The report's texts, read afresh (a generator over the file, as the command reads them)."""
    from posprobe.texts.reading import iter_texts

    return iter_texts(call.text, call.column)


def _profiles(call: SectionCall) -> dict:
    from posprobe.pipelines.weights import profiles

    text_kwargs = {} if call.text is None else {"texts": _texts(call), "max_texts": call.max_texts}
    source = call.source(with_tokenizer=call.text is not None)
    out_dir = call.out_dir()
    result = profiles(None, _all_is_none(call.options.get("layers", "all")), "paper", source=source, **text_kwargs)
    if call.text is not None and result.conditioning is not None:
        result = replace(result, conditioning={**result.conditioning, "text": str(call.text)})
    saved = result.save(out_dir)
    return result.to_dict() | {"npz": str(saved["npz"]), "figures": _paths(saved["figures"])}


def _all_is_none(value: str | None):
    """`--layers` as `fit-tisa` and `profiles` take it: 'all' (or None) -> None, else the list of ints."""
    return None if value in (None, "all") else _layers(value)


def _fit_tisa(call: SectionCall) -> dict:
    from posprobe.pipelines.fitting import fit_tisa

    out_dir = call.out_dir()
    layers = _all_is_none(call.options.get("layers", "all"))
    result = fit_tisa(call.model, [5], layers=layers, allow_pickle=call.allow_pickle)  # the command's default S = 5
    return result.save(out_dir).to_dict()


def _attention(call: SectionCall) -> dict:
    from posprobe.capture.textrun import DEFAULT_BATCH_SIZE, check_run_settings
    from posprobe.pipelines.attention import attention_profiles, write_attention

    max_length, max_texts, batch_size, _ = check_run_settings(None, call.max_texts, DEFAULT_BATCH_SIZE)
    source = call.source(with_tokenizer=True)
    out_dir = call.folder.expanduser()
    result = attention_profiles(source, _texts(call), max_length=max_length, max_texts=max_texts, batch_size=batch_size,
                                allow_pickle=call.allow_pickle, text_source=str(call.text))  # fmt: skip
    result = replace(result, model=source.name)
    written = write_attention(result, out_dir, "png", window=min(20, result.max_length - 1))  # the command's W = 20
    return result.record(written["npz"], written["figures"])


def _states(call: SectionCall) -> dict:
    from posprobe.capture.textrun import DEFAULT_BATCH_SIZE, check_run_settings
    from posprobe.pipelines.states import states
    from posprobe.pipelines.states_result import write_states

    max_length, max_texts, batch_size, _ = check_run_settings(None, call.max_texts, DEFAULT_BATCH_SIZE)
    source = call.source(with_tokenizer=True)
    out_dir = call.folder.expanduser()
    # the command's defaults: probe every state, a sample of 2048 tokens, seed 0, 8 null draws, 5 controls
    result = states(source, _texts(call), max_length=max_length, max_texts=max_texts, batch_size=batch_size,
                    min_texts=int(call.options.get("min_texts", 16)), probe_layers=None, mae_sample=2048, seed=0,
                    null_draws=8, controls=5, allow_pickle=call.allow_pickle, text_source=str(call.text))  # fmt: skip
    result = replace(result, model=source.name, revision=None)
    written = write_states(result, out_dir, "png")
    return result.record(written["npz"], written["figures"])


#: command -> its run through the library (the commands not here run as commands: `run.command_runner`)
RUNS: dict[str, Callable[[SectionCall], dict]] = {
    "toeplitz": _toeplitz,
    "fhat": _fhat,
    "profiles": _profiles,
    "fit-tisa": _fit_tisa,
    "rotary": _rotary,
    "attention": _attention,
    "states": _states,
    "context": _context,
    "needle": _needle,
}
