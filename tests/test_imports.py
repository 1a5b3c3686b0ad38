"""The layering docs/development.md describes, held against the code: the import graph of
hf2triton's modules (cli/, flows/ and tasks/ as the package maps them: hf2triton.cli, ...), read
with ast from every import statement, at module level and inside functions alike (those under
`if TYPE_CHECKING:` never run and are left out), has no cycle. The one exception: a plug-in
package's registry importing its own plug-ins (`hf2triton/kinds/__init__.py` imports the kind
modules, which register themselves in its `KINDS`)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

FOLDERS = {"hf2triton": "hf2triton", "cli": "hf2triton.cli", "flows": "hf2triton.flows",
           "tasks": "hf2triton.tasks"}


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            if folder == "hf2triton" and parts and parts[0] in ("cli", "flows", "tasks"):
                continue
            found[name] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or \
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The hf2triton modules `name` imports: `from a.b import c` is a.b.c where that is a module,
    else a.b; relative imports resolved against the module's package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            skipped.update(id(n) for n in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def import_graph(registries: bool = False) -> dict[str, set[str]]:
    """Who imports whom. Without `registries`, a plug-in's import of its own package (the
    registry it registers in, which imports it back) is left out: the one cycle allowed."""
    found = modules()
    known = set(found)
    graph = {name: imports(name, path, known) for name, path in found.items()}
    if not registries:
        graph = {name: {t for t in targets if not name.startswith(t + ".")}
                 for name, targets in graph.items()}
    return graph


def test_no_import_cycle_among_hf2tritons_modules():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_graph_sees_function_level_imports():
    """The reader finds imports inside functions (the way cycles used to be hidden)."""
    graph = import_graph(registries=True)
    assert "hf2triton.flows.release" in graph["hf2triton.cli.main"]  # imported in a function
    assert "hf2triton.kinds" in graph["hf2triton.kinds.embedding"]  # its registry
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
