"""The package's shape: its import graph (every import: at module level, inside functions, and module names handed
to `import_module` or kept in lazy-import tables) has no cycle between modules nor between packages; each package
imports only the layers below it; the root keeps only the package's face."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "posprobe"

# The layers, lowest first: a package (or root module) may import only what is listed before it. The root face
# (`posprobe/__init__.py`, lazy exports of everything) comes last, and nothing inside the package imports it.
LAYERS = (
    "posprobe.version",
    "posprobe.errors",
    "posprobe.validation",
    "posprobe.results",
    "posprobe.runtime",  # torchrun ranks, named phases
    "posprobe.architectures",  # the family table and config reading: no tensors
    "posprobe.checkpoint",  # finding checkpoints, reading their files
    "posprobe.formats",  # file formats and atomic writes
    "posprobe.mechanisms",  # positional mechanisms to retrofit
    "posprobe.analysis",  # pure numpy analyses
    "posprobe.families",  # the model reader and score functions per position kind
    "posprobe.kernel",  # the one attention function (AttentionInterface) and the taps that observe or edit it
    "posprobe.edits",  # the user's edits of a run (SPEC §20): parsed, checked, applied as taps and hooks
    "posprobe.retrofitting",  # installing mechanisms, loading models
    "posprobe.corpora",  # texts in the box
    "posprobe.texts",  # reading texts
    "posprobe.capture",  # running a model on text, handing each batch to reducers
    "posprobe.plotting",  # figures from results
    "posprobe.pipelines",  # load + analyse + return results, one per command
    "posprobe.glue",  # fine-tuning and evaluation
    "posprobe.report",  # every analysis on one page
    "posprobe.cli",  # the command line
    "posprobe.__main__",
    "posprobe",  # the root face: lazy exports
)
ROOT_MODULES = {"__init__", "__main__", "errors", "validation", "results", "version"}  # at most six: the package's face


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `package` (a package's name for its __init__)."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph(package: Path = PACKAGE, strings: bool = True) -> dict[str, set[str]]:
    """module -> the package's modules it imports: import statements anywhere in the file (a name imported from a
    package counts as its module if it is one, else as the package), and string constants that name one of the
    package's modules (what `import_module("...")` and lazy-export tables import) unless `strings` is False."""
    modules = module_files(package)
    root = package.name
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        home = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = home.split(".")[: len(home.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            elif (
                strings
                and isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith(root + ".")
            ):
                targets = [node.value] if node.value in modules else []
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
                    break  # `from pkg import module` counts the module, not also the package
    return graph


def node_of(module: str, root: str = "posprobe") -> str:
    """A module's node in the package graph: its top-level subpackage, or itself for a root module."""
    parts = module.split(".")
    return module if len(parts) <= 2 else ".".join(parts[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto packages (and root modules); edges inside one node dropped."""
    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = folded.setdefault(node_of(module), set())
        edges.update(node_of(t) for t in targets if node_of(t) != node_of(module))
    for edges in list(folded.values()):
        for target in edges:
            folded.setdefault(target, set())
    return folded


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v), on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_module_import_graph_has_no_cycle():
    """Import statements only: a package's lazy registry (module names as strings) may name its own modules."""
    assert cycles(import_graph(strings=False)) == []


@pytest.mark.slow
def test_the_package_import_graph_has_no_cycle():
    assert cycles(package_graph(import_graph())) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_planted_cycle_between_packages_fails(tmp_path):
    """Two subpackages of a planted package that import each other only inside a function and through
    `import_module`: the module graph has no cycle, the package graph does, and the test above would fail."""
    files = {
        "pkg/__init__.py": '"""Planted."""\n',
        "pkg/low/__init__.py": '"""Low."""\n',
        "pkg/low/reader.py": "def read():\n    from pkg.high.user import use\n\n    return use\n",
        "pkg/high/__init__.py": '"""High."""\n',
        "pkg/high/user.py": (
            "from importlib import import_module\n\n\ndef use():\n    return import_module('pkg.low.helper')\n"
        ),
        "pkg/low/helper.py": "X = 1\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path / "pkg")
    assert graph["pkg.low.reader"] == {"pkg.high.user"} and graph["pkg.high.user"] == {"pkg.low.helper"}
    assert cycles(import_graph(tmp_path / "pkg", strings=False)) == []
    assert cycles(package_graph(graph)) == [["pkg.high", "pkg.low"]]


def test_every_package_imports_only_the_layers_below_it():
    folded = package_graph(import_graph())
    assert set(folded) == set(LAYERS), "a new package or root module: give it its place in LAYERS"
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted(f"{a} -> {b}" for a, targets in folded.items() for b in targets if rank[b] > rank[a])
    assert upward == []


def test_the_root_keeps_only_the_package_face():
    root = {p.stem for p in PACKAGE.glob("*.py")}
    assert root == ROOT_MODULES and len(root) <= 6


def test_every_package_opens_with_a_one_line_docstring_of_its_job():
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")), clean=False) or ""
        first = doc.split("\n", 1)[0]
        assert first.strip() and first.rstrip().endswith((".", ":")), init
