"""Sections run through the library: the pipeline function its command calls, `result.save(folder)` and the record
the command prints with `--json` (built from `result.to_dict()` and the saved paths as the command builds it), with
no command line parsed and no stdout read.

`RUNS[command](call) -> record` where `call` (`SectionCall`) holds the model, the section's own arguments as the
reproducing command spells them (`options`: '--lengths 256,512' -> {'lengths': '256,512'}), the report's texts
and the section's folder. Only the arguments the section's command line names are passed: every other one falls to
the pipeline function's own default, the command's (`pipelines.defaults`, which the command's options show), so
that the report and the command cannot drift apart; tests/test_report_loads.py checks that each section's record
equals its reproducing command's, run alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from posprobe.pipelines.defaults import ALL_LAYERS, CONTEXT_TEXT, ROPE_SCALING


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


def _given(options: dict, **kinds) -> dict:
    """The keyword arguments the section's command line names (`kinds`: option name -> its type), as values; the
    options it does not name are left out, so that the pipeline function's defaults (the command's) apply."""
    return {name: kind(options[name]) for name, kind in kinds.items() if name in options}


def _layers(value: str | None):
    """A `--layers` value as the command parses it: 'all' (or None) -> None (every layer), else the list of ints."""
    return None if value in (None, ALL_LAYERS) else [int(part) for part in value.split(",")]


def _numbers(kind):
    """'256,512' -> [256, 512] (`kind` int or float)."""
    return lambda value: [kind(part) for part in value.split(",")]


def _toeplitz(call: SectionCall) -> dict:
    from posprobe.pipelines.weights import toeplitz

    source = call.source()
    out_dir = call.out_dir()
    return toeplitz(source=source).save(out_dir).record


def _fhat(call: SectionCall) -> dict:
    from posprobe.pipelines.weights import fhat

    source = call.source()
    out_dir = call.out_dir()
    return fhat(source=source, **_given(call.options, layer=int)).save(out_dir).record


def _rotary(call: SectionCall) -> dict:
    from posprobe.pipelines.rotary import rotary

    source = call.source()
    out_dir = call.out_dir()
    result = rotary(None, _layers(call.options.get("layers")), source=source,
                    **_given(call.options, rope_scaling=str))  # fmt: skip
    return result.command_record(result.save(out_dir))


def _context(call: SectionCall) -> dict:
    from posprobe.families.rope_variants import parse_variants
    from posprobe.pipelines.context import check_family, check_lengths, context
    from posprobe.texts.reading import check_texts, iter_texts

    o = call.options
    lengths = check_lengths(o["lengths"])
    rope_scaling = o.get("rope_scaling", ROPE_SCALING)
    variants = parse_variants(rope_scaling)
    text = o.get("text", CONTEXT_TEXT)
    check_texts(text, None, 1)
    source = call.source(with_tokenizer=True)
    check_family(source, variants, lengths)
    result = context(None, lengths, texts=iter_texts(text, None), rope_scaling=rope_scaling,
                     allow_pickle=call.allow_pickle, source=source, **_given(o, windows=int, device=str))  # fmt: skip
    result = replace(result, text={"source": text, **result.text})
    return result.command_record(result.save(call.out_dir()))


def _needle(call: SectionCall) -> dict:
    from posprobe.pipelines.needle import NeedleGrid, needle

    o = call.options
    grid = NeedleGrid(**_given(o, lengths=_numbers(int), depths=_numbers(float), trials=int, beyond_window=bool))
    source = call.source(with_tokenizer=True)
    out_dir = call.out_dir()
    result = needle(None, grid=grid, allow_pickle=call.allow_pickle, source=source,
                    **_given(o, haystack=str, device=str))  # fmt: skip
    return result.command_record(result.save(out_dir))


def _texts(call: SectionCall):
    """The report's texts, read afresh (a generator over the file, as the command reads them)."""
    from posprobe.texts.reading import iter_texts

    return iter_texts(call.text, call.column)


def _profiles(call: SectionCall) -> dict:
    from posprobe.pipelines.weights import profiles

    text_kwargs = {} if call.text is None else {"texts": _texts(call), "max_texts": call.max_texts}
    source = call.source(with_tokenizer=call.text is not None)
    out_dir = call.out_dir()
    result = profiles(None, _layers(call.options.get("layers")), source=source, **text_kwargs)
    if call.text is not None and result.conditioning is not None:
        result = replace(result, conditioning={**result.conditioning, "text": str(call.text)})
    return result.command_record(result.save(out_dir))


def _fit_tisa(call: SectionCall) -> dict:
    from posprobe.pipelines.fitting import fit_tisa

    out_dir = call.out_dir()
    result = fit_tisa(call.model, layers=_layers(call.options.get("layers")), allow_pickle=call.allow_pickle)
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
    return result.command_record(write_attention(result, out_dir, "png", **_given(call.options, window=int)))


def _states(call: SectionCall) -> dict:
    from posprobe.capture.textrun import DEFAULT_BATCH_SIZE, check_run_settings
    from posprobe.pipelines.states import states
    from posprobe.pipelines.states_result import write_states

    max_length, max_texts, batch_size, _ = check_run_settings(None, call.max_texts, DEFAULT_BATCH_SIZE)
    source = call.source(with_tokenizer=True)
    out_dir = call.folder.expanduser()
    result = states(source, _texts(call), max_length=max_length, max_texts=max_texts, batch_size=batch_size,
                    allow_pickle=call.allow_pickle, text_source=str(call.text),
                    **_given(call.options, min_texts=int))  # fmt: skip
    result = replace(result, model=source.name, revision=None)
    return result.command_record(write_states(result, out_dir, "png"))


#: command -> its run through the library (every command a section runs)
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
