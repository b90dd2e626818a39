"""The package's shape: its import graph (every import, at module level and inside functions) has no cycle, and
the low layers import nothing above them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "posprobe"


def import_graph() -> dict[str, set[str]]:
    """module -> the posprobe modules it imports (a name imported from a package counts as its module if it is
    one, else as the package)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
                    break  # `from pkg import module` counts the module, not also the package
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v), on_stack.add(v)
        for w in graph[v]:
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


def test_the_import_graph_has_no_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_low_layers_import_nothing_above_them():
    """errors / validation / results, file I/O (checkpoint), the family reader, pure numpy analysis and the file
    writer never import pipelines, plotting or the CLI; no writer imports a pipeline."""
    upper = ("posprobe.capture", "posprobe.pipelines", "posprobe.plotting", "posprobe.cli", "posprobe.glue")
    lower = ("posprobe.errors", "posprobe.validation", "posprobe.results", "posprobe.checkpoint", "posprobe.families",
             "posprobe.analysis", "posprobe.outputs", "posprobe.kernels_file")  # fmt: skip
    graph = import_graph()
    wrong = sorted(
        f"{m} -> {t}" for m, targets in graph.items() if m.startswith(lower) for t in targets if t.startswith(upper)
    )
    assert wrong == []
