"""One save path: every result states the files it writes (its arrays with their metadata, its JSON records, its
figures) as `OutputFile`s from `output_files(fmt, **options)` (a `.npz` always through `arrays_file`, from the
result's declared `ARRAYS`: `formats.arrays`), and `save(result, out_dir, fmt)` writes them all as one unit
(`writing.write_files`: staged in a hidden folder, moved into place only once every file succeeded, so a failed or
interrupted run leaves nothing), JSON records beside the arrays where the result keeps one. The CLI commands and
the library's `result.save(out_dir)` both go through `save`.

`save` returns a `Saved`: the final paths by group ('npz' and 'json': one path; 'figures' and any other group: a
list, in the order the result gave), every path by file name (`paths`) and the JSON records as written (`records`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posprobe.errors import PosprobeError
from posprobe.formats.arrays import check_arrays, write_arrays
from posprobe.formats.writing import FIGURE_FORMATS, figure_writer, json_writer, write_files

SINGLE_GROUPS = ("npz", "json")  # groups with one file: `Saved[group]` is its path


@dataclass(frozen=True)
class OutputFile:
    """One file of a result: its `name` in the output folder, its `group` ('npz', 'json', 'figures', ...: how `Saved`
    hands its path back), and either `write(path)` (writes the file at `path`) or `record(saved)` (a JSON record,
    given the final paths of every file of the result, e.g. to name them inside it). A file of declared arrays
    also keeps what it writes, `arrays` = (metadata, arrays, dims), so that another format can be written from
    the same declaration here, without the result."""

    name: str
    group: str
    write: Callable[[Path], None] | None = None
    record: Callable[[Saved], Any] | None = None
    arrays: tuple[dict, dict, dict] | None = None


def arrays_file(name: str, result, group: str = "npz", **options) -> OutputFile:
    """A result's `.npz`: `result.arrays(**options)` checked against its class's `ARRAYS` declaration now (a mistake
    is an `arrays.ArrayDeclarationError` before anything is written), with `result.metadata()` and the dimension
    names (`formats.arrays.write_arrays`: the one `.npz` writer; read back with `load_npz` or `load_named`)."""
    return declared_file(name, result.metadata(), result.arrays(**options), type(result).ARRAYS, group)


def declared_file(name: str, metadata: dict, arrays: dict, declaration: dict, group: str = "npz") -> OutputFile:
    """`arrays_file` for arrays that are not one result object's: checked against `declaration` now."""
    dims = check_arrays(arrays, declaration, name)
    return OutputFile(
        name, group, write=lambda p: write_arrays(p, metadata, arrays, dims), arrays=(metadata, arrays, dims)
    )


def record_file(name: str, record: Any | Callable[[Saved], Any], group: str = "json") -> OutputFile:
    """A JSON record (indented): `record`, or `record(saved)` when it is callable (it then sees the final paths)."""
    return OutputFile(name, group, record=record if callable(record) else (lambda saved: record))


def figure_file(name: str, make_figure: Callable[[], Any], group: str = "figures") -> OutputFile:
    """A figure drawn only when it is written (`make_figure()`: a matplotlib Figure or a `plotting.Mosaic`)."""
    return OutputFile(name, group, write=figure_writer(make_figure))


def text_file(name: str, text: str | Callable[[], str], group: str) -> OutputFile:
    """A UTF-8 text file (`text`, or `text()` called when it is written)."""
    return OutputFile(name, group, write=lambda p: p.write_text(text() if callable(text) else text, encoding="utf-8"))


class Saved(dict):
    """What `save` wrote: group -> path ('npz', 'json') or [paths] (every other group), plus `paths` (file name ->
    path, in order) and `records` (file name -> the JSON object written)."""

    def __init__(self, paths: dict[str, Path], groups: dict[str, str]):
        super().__init__(figures=[])  # every result's figures, none for some
        self.paths = paths
        self.records: dict[str, Any] = {}
        for name, path in paths.items():
            group = groups[name]
            if group in SINGLE_GROUPS:
                self.setdefault(group, path)
            else:
                self.setdefault(group, []).append(path)

    @property
    def record(self) -> Any:
        """The JSON object written as the 'json' file (None where there is none)."""
        return self.records.get(self["json"].name) if "json" in self else None


def check_format(fmt: str) -> str:
    """A figure format posprobe writes (png, pdf, svg), else one line saying which."""
    if fmt not in FIGURE_FORMATS:
        raise PosprobeError(f"unknown figure format '{fmt}'", f"use one of: {', '.join(FIGURE_FORMATS)}")
    return fmt


def save(result, out_dir: str | Path, fmt: str = "png", **options) -> Saved:
    """Write every file `result.output_files(fmt, **options)` states into `out_dir` as one unit (staged, atomic;
    created if missing), JSON records included; returns their paths (`Saved`)."""
    fmt = check_format(getattr(fmt, "value", fmt))
    return save_files(out_dir, result.output_files(fmt, **options))


def save_files(out_dir: str | Path, files: Iterable[OutputFile]) -> Saved:
    """`save` for a list of `OutputFile`s (a result that is not one object: `posprobe compare`'s record)."""
    out = Path(out_dir).expanduser()
    files = list(files)
    saved = Saved({f.name: out / f.name for f in files}, {f.name: f.group for f in files})
    writers = {}
    for f in files:
        if f.record is not None:
            saved.records[f.name] = f.record(saved)
            writers[f.name] = json_writer(saved.records[f.name])
        else:
            writers[f.name] = f.write
    write_files(out, writers)
    return saved


class Saves:
    """`result.save(out_dir, fmt, **options)`: the library's way to write what the CLI writes (`save`)."""

    def output_files(self, fmt: str, **options) -> list[OutputFile]:  # pragma: no cover - every result defines it
        raise NotImplementedError

    def save(self, out_dir: str | Path, fmt: str = "png", **options) -> Saved:
        """Write this result's files (arrays, records, figures) into `out_dir` as one unit; returns their paths."""
        return save(self, out_dir, fmt, **options)

    def command_record(self, saved: Saved) -> Any:
        """The record its command prints with `--json` (and `posprobe report` keeps), once `saved` is written: the
        JSON record written beside the figures, or, for a result without one, `to_dict()` with the saved paths."""
        return saved.record
