"""Texts to run a model on: a text file (one text per non-empty line), a `.jsonl` / `.csv` column, a column of a
hub dataset split (`hub:NAME[:CONFIG]:SPLIT`), or a text in the box (`builtin:sentences`, `builtin:kjv`:
`posprobe.corpora`). Read lazily, one text at a time, and validated where read: a bad
file is one `PosprobeError` naming the file and line.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

from posprobe.corpora import builtin_name, is_builtin, iter_builtin
from posprobe.errors import PosprobeError

TEXT_SUFFIXES = (".txt", ".jsonl", ".csv")
_CSV_FIELD_LIMIT = 2**31 - 1  # the csv module's default refuses fields over 128 KiB
HUB_PREFIX = "hub:"


def parse_hub_texts(text: str) -> tuple[str, str | None, str] | None:
    """`hub:NAME:SPLIT` or `hub:NAME:CONFIG:SPLIT` -> (name, config, split); None for anything else (a file)."""
    if not str(text).startswith(HUB_PREFIX):
        return None
    parts = str(text)[len(HUB_PREFIX) :].split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise PosprobeError(
            f"'{text}' is not a hub dataset spec",
            "write hub:NAME:SPLIT or hub:NAME:CONFIG:SPLIT, e.g. hub:nyu-mll/glue:cola:validation",
        )
    return parts[0], (parts[1] if len(parts) == 3 else None), parts[-1]


def _hub_texts(spec: tuple[str, str | None, str], column: str | None) -> Iterator[str]:
    """The texts of column `column` of a hub dataset split (cache only when offline)."""
    from posprobe.texts.hub import load_hub_dataset

    name, config, split = spec
    where = f"hub:{name}" + (f":{config}" if config else "") + f":{split}"
    if not column:
        raise PosprobeError(f"'{where}' is a dataset: which column holds the texts?", "pass --column NAME")
    table = load_hub_dataset(name, config, split, f"'{where}'", "pass a local .txt, .jsonl or .csv file with --text")
    if column not in table.column_names:
        raise PosprobeError(
            f"'{where}' has no column '{column}' (columns: {', '.join(table.column_names)})",
            "pass one of them with --column",
        )
    for number, value in enumerate(table[column], 1):
        if not isinstance(value, str):
            raise PosprobeError(
                f"{where} row {number}: column '{column}' is not text ({value!r})", "choose a text column"
            )
        if value.strip():
            yield value


def _text_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".csv"):
        return suffix[1:]
    return "txt"


def iter_texts(path: str | Path, column: str | None = None) -> Iterator[str]:
    """The texts of `path`: a text file (one text per non-empty line), `.jsonl` / `.csv` with `column`, or a hub
    dataset split `hub:NAME[:CONFIG]:SPLIT` with `column`. Blank texts (empty or white space only) are skipped in
    every format.

    Raises PosprobeError naming the file and line for a missing column, malformed JSON or a non-text value."""
    if is_builtin(path):
        if column:
            raise PosprobeError(f"--column applies to .jsonl and .csv files, not '{path}'", "drop --column")
        yield from iter_builtin(path)
        return
    spec = parse_hub_texts(str(path))
    if spec is not None:
        yield from _hub_texts(spec, column)
        return
    path = Path(path).expanduser()
    kind = _text_format(path)
    if kind != "txt" and not column:
        raise PosprobeError(f"'{path}' is a .{kind} file: which column holds the texts?", "pass --column NAME")
    if kind == "txt" and column:
        raise PosprobeError(f"--column applies to .jsonl and .csv files, not '{path.name}'", "drop --column")
    try:
        # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8", Notepad) is not part of the first text or column name
        with open(path, encoding="utf-8-sig", newline="" if kind == "csv" else None) as fh:
            if kind == "txt":
                for line in fh:
                    text = line.rstrip("\r\n")
                    if text.strip():
                        yield text
            elif kind == "jsonl":
                for number, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    if (text := _field(_json_record(line, path, number), column, path, number)).strip():
                        yield text
            else:
                csv.field_size_limit(_CSV_FIELD_LIMIT)  # one long text is a text, not an error
                reader = csv.DictReader(fh)
                if reader.fieldnames is not None and column not in reader.fieldnames:
                    raise PosprobeError(
                        f"'{path}' has no column '{column}' (its first line, read as the column names: "
                        f"{_short_repr(', '.join(reader.fieldnames))})",
                        "pass one of them with --column, or add a first line naming the columns",
                    )
                for record in reader:
                    if (text := _field(record, column, path, reader.line_num)).strip():
                        yield text
    except UnicodeDecodeError as err:
        raise PosprobeError(f"'{path}' is not UTF-8 text ({err.reason})", "convert it to UTF-8") from err
    except csv.Error as err:  # a NUL byte in a quoted field, an unterminated quote at the end of the file
        raise PosprobeError(f"'{path}' is not a readable .csv file ({err})", "save it again as CSV (UTF-8)") from err
    except OSError as err:  # permission denied, an I/O error of the disk, a folder named like a file
        raise PosprobeError(f"cannot read '{path}' ({err.strerror or err})", "pass a readable text file") from err


def _json_record(line: str, path: Path, number: int) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise PosprobeError(f"{path}:{number}: not valid JSON ({err.msg})", "one JSON object per line") from err
    except RecursionError as err:  # arrays nested thousands deep: Python's parser runs out of stack
        raise PosprobeError(f"{path}:{number}: JSON nested too deeply", "one flat JSON object per line") from err
    if not isinstance(record, dict):
        raise PosprobeError(f"{path}:{number}: a JSON object was expected", "one JSON object per line")
    return record


def _field(record: dict, column: str, path: Path, number: int) -> str:
    if column not in record:
        raise PosprobeError(
            f"{path}:{number}: no column '{column}' (fields: {', '.join(map(str, record))})",
            "pass one of them with --column",
        )
    value = record[column]
    if not isinstance(value, str):
        raise PosprobeError(
            f"{path}:{number}: column '{column}' is not text ({_short_repr(value)})", "choose a text column"
        )
    return _encodable(value, f"{path}:{number}")


def _short_repr(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _encodable(text: str, where: str) -> str:
    """`text` when it is valid Unicode; a JSON escape such as "\\ud800" (half of a surrogate pair, cut where a
    tool truncated the string) gives a str the tokenizer cannot take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise PosprobeError(
            f"{where}: the text holds {err.object[err.start : err.end]!r}, half of a UTF-16 surrogate pair "
            "(not a character)",
            "fix or drop that record (it was probably cut in the middle of an emoji)",
        ) from err
    return text


_PIPE_HINT = " (texts from a pipe or a device: save them to a file first, as they are read twice)"


def not_a_file(path: Path) -> str:
    """What `path`, which is not a regular file, is, in words: 'does not exist', 'is a folder', 'is a named pipe
    (FIFO)', ... (read from its own status, so a pipe or device is never opened and nothing blocks)."""
    import stat

    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "is a link to a missing file" if path.is_symlink() else "does not exist"
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO), not a file"),
             (stat.S_ISSOCK, "a socket, not a file"), (stat.S_ISCHR, "a character device, not a file"),
             (stat.S_ISBLK, "a block device, not a file"))  # fmt: skip
    return "is " + next((word for test, word in kinds if test(mode)), "not a regular file")


def check_texts(path: str | Path, column: str | None = None, max_texts: int | None = None) -> int:
    """Validate the text file before any work (exists, readable, right column, not empty); return the number
    of texts that will be used (at most `max_texts`)."""
    if is_builtin(path):
        builtin_name(path)
    elif parse_hub_texts(str(path)) is None and not Path(path).expanduser().is_file():
        what = not_a_file(Path(path).expanduser())
        raise PosprobeError(
            f"text file '{path}' {what}",
            "pass a .txt, .jsonl or .csv file with --text" + ("" if what == "does not exist" else _PIPE_HINT),
        )
    count = 0
    for _ in iter_texts(path, column):
        count += 1
        if max_texts is not None and count >= max_texts:
            break
    if count == 0:
        raise PosprobeError(f"'{path}' holds no texts", "pass a file with at least one non-empty text")
    return count
