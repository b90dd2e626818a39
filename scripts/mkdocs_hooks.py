"""MkDocs hooks (mkdocs.yml `hooks:`): the site serves files that live outside docs/ at their repository paths.

`figures/` (every figure, made by `figures/regenerate.sh`), the figures of committed benchmark runs
(`benchmarks/results/`), `posprobe/SPEC.md` (the one source of formulas) and
`benchmarks/RESULTS.md` are added to the build as they are, so a page links `../figures/toeplitz/...png` or
`posprobe/SPEC.md#2-toeplitz-r2-...` and nothing is copied into docs/ by hand.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
SHARED = ("posprobe/SPEC.md", "benchmarks/RESULTS.md")
FIGURE_SUFFIXES = (".png", ".svg")


def on_files(files, config):
    paths = list(SHARED)
    for folder in ("figures", "benchmarks/results"):
        found = (ROOT / folder).rglob("*")
        paths += sorted(p.relative_to(ROOT).as_posix() for p in found if p.suffix in FIGURE_SUFFIXES)
    for path in paths:
        files.append(File(path, src_dir=str(ROOT), dest_dir=config["site_dir"], use_directory_urls=False))
    return files
