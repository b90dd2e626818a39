"""The Python examples of the README and of the documentation pages (docs/, where most of the README's moved) run
as written, from an empty folder outside the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCKS = [b for page in PAGES for b in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)]


def test_the_readme_has_python_examples():
    assert re.search(r"```python\n", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(BLOCKS) >= 2
    assert not [b for b in BLOCKS if "figures/" in b]  # nothing that exists only in the repository


@pytest.mark.slow  # ~30 s: the Python blocks load SmolLM2's GGUF
@pytest.mark.integration
def test_readme_python_blocks_run(tmp_path):
    """All blocks in order in one interpreter (as a reader pasting them into one notebook), in an empty folder."""
    script = tmp_path / "readme.py"
    script.write_text("\n\n".join(BLOCKS), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert list(tmp_path.rglob("config.json"))  # the retrofit example saved its model here, not in the repository
    assert (tmp_path / "profiles_layer3.png").is_file()
