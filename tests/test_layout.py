"""The layering docs/development.md describes, held against the code: the import graph of
hf2triton's modules (cli/, flows/ and tasks/ as the package maps them: hf2triton.cli, ...), read
with ast from every import statement, at module level, inside functions and under
`if TYPE_CHECKING:` alike (a circle of types is a circle of design), has no cycle, with no
exception: a plug-in package's table lives in its base module (`hf2triton/kinds/base.py`'s
`KINDS`), where its plug-ins register themselves, and the package's `__init__` imports the
plug-in modules, none of which imports the package back.

The packages read top-down: each imports only packages of its own layer or below (`LAYERS`),
and no two packages import each other, directly or round a circle. The size limits a reader can
hold in their head: at most three modules at hf2triton's root, no module over 600 lines (the
limits on functions are tests/test_design.py's)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

FOLDERS = {
    "hf2triton": "hf2triton",
    "cli": "hf2triton.cli",
    "flows": "hf2triton.flows",
    "tasks": "hf2triton.tasks",
}


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


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The hf2triton modules `name` imports: `from a.b import c` is a.b.c where that is a module,
    else a.b; relative imports resolved against the module's package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
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


def import_graph() -> dict[str, set[str]]:
    """Who imports whom: every import, a plug-in's of its own package's `__init__` included."""
    found = modules()
    known = set(found)
    return {name: imports(name, path, known) for name, path in found.items()}


def test_no_import_cycle_among_hf2tritons_modules():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_graph_sees_function_level_imports():
    """The reader finds imports inside functions (the way cycles used to be hidden), and a
    plug-in's import of its own package's `__init__` (the way registries made cycles)."""
    graph = import_graph()
    assert "hf2triton.flows.release" in graph["hf2triton.cli.main"]  # imported in a function
    assert "hf2triton.kinds.embedding" in graph["hf2triton.kinds"]  # the package its plug-in
    assert "hf2triton.kinds.base" in graph["hf2triton.kinds.embedding"]  # the table it joins
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    probe = {"hf2triton.p": {"hf2triton.p.x"}, "hf2triton.p.x": {"hf2triton.p"}}
    assert cycles(probe) == [["hf2triton.p", "hf2triton.p.x"]]  # a plug-in importing its package


# Top-down: entry points; Prefect glue; the release steps and the watch; the spec that chooses
# the plug-ins; the plug-ins (sources before the training they run, targets before the image
# they run); the service clients; the serving core (copied into every version, imports nothing
# of the rest); the utilities and the error types.
LAYERS = [
    {"cli", "flows", "tasks"},
    {"orchestration"},
    {"release", "watch"},
    {"spec"},
    {"sources", "targets"},
    {"training", "image", "stores", "runtimes"},
    {"kinds"},
    {"clients"},
    {"openai_api", "serving"},
    {"util"},
    {"errors"},
]


def package_of(module: str) -> str:
    """`hf2triton.release.gate` -> "release"; a root module is its own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, targets in import_graph().items():
        if name == "hf2triton":  # the package's face: `import hf2triton` switches telemetry off
            continue
        # Importing the face (clients.mlflow: to find where hf2triton lies) is no layer's import.
        graph.setdefault(package_of(name), set()).update(
            package_of(t) for t in targets if package_of(t) not in (package_of(name), "hf2triton")
        )
    return graph


def test_packages_import_downwards_only():
    layer = {pkg: i for i, pkgs in enumerate(LAYERS) for pkg in pkgs}
    graph = package_graph()
    assert set(graph) <= set(layer), f"packages without a layer: {set(graph) - set(layer)}"
    upwards = sorted(
        f"{a} -> {b}" for a, targets in graph.items() for b in targets if layer[b] < layer[a]
    )
    assert not upwards, f"imports pointing back up: {upwards}"
    assert not cycles(graph), f"packages importing each other: {cycles(graph)}"


def test_at_most_three_modules_at_the_root():
    root = sorted(p.name for p in (ROOT / "hf2triton").glob("*.py") if p.name != "__init__.py")
    assert len(root) <= 3, root


def test_no_module_over_600_lines():
    long_modules = [
        f"{name} ({text.count(chr(10))} lines)"
        for name, path in modules().items()
        if (text := path.read_text(encoding="utf-8")).count("\n") > 600
    ]
    assert not long_modules, long_modules


def test_type_checking_imports_count(tmp_path):
    """A circle through `if TYPE_CHECKING:` imports is found (it used to be left out)."""
    import textwrap

    tree = textwrap.dedent("""
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from hf2triton.spec import ReleaseSpec
    """)
    path = tmp_path / "probe.py"
    path.write_text(tree)
    assert imports("hf2triton.kinds.probe", path, {"hf2triton.spec"}) == {"hf2triton.spec"}
