"""Real English sentences for the integration tests, committed with them (tests/data/sentences.txt: 144 sentences
of 2-16 words written for posprobe), so that a clean clone runs every real-model test without the project's shared
GLUE folder."""

from __future__ import annotations

from pathlib import Path

SENTENCES_FILE = Path(__file__).resolve().parent / "data" / "sentences.txt"


def real_sentences(count: int | None = None) -> list[str]:
    """The first `count` sentences (all 144 with None), one per line of the file."""
    lines = [line.strip() for line in SENTENCES_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines if count is None else lines[:count]
