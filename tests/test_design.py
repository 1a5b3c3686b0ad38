"""The code's size by design, held against the code (issue 41): what a reader can hold in their
head. No function over 60 lines (benchmarks/ included), no function over six parameters but the
few whose reason is written beside them, no parameter that carries the pipeline's data typed
`Any`, and a namesake test (tests/<package>/test_<module>.py) for most modules with logic of
their own. Measured after ruff format, with ast."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

# Where the product's code lives: the library, its entry points and the benchmarks.
CODE = ("hf2triton", "cli", "flows", "tasks", "benchmarks")
MAX_LINES = 60
MAX_PARAMS = 6
# The functions with more parameters, each for the reason written beside its def.
WIDE = {
    "hf2triton/release/load.py:closed_loop"  # a load generator's knobs, all but four defaulted
}
# The names of the parameters that carry the pipeline's data between its steps.
DATA = {"spec", "deploy", "cfg", "kind", "exp", "val", "src", "variants", "tuned", "repo", "data"}
NAMESAKE_SHARE = 0.6


def functions(folders: tuple[str, ...] = CODE):
    """(path relative to the root, function node) of every function in `folders`."""
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if any(part.startswith(".") for part in path.relative_to(ROOT).parts):
                continue  # a git-ignored environment (benchmarks/.venv-infinity): not ours
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield path.relative_to(ROOT).as_posix(), node


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = node.args
    return [p for p in (*a.posonlyargs, *a.args, *a.kwonlyargs) if p.arg not in ("self", "cls")]


def test_no_function_over_60_lines():
    long = [
        f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, node in functions()
        if node.end_lineno - node.lineno + 1 > MAX_LINES
    ]
    assert not long, long


def test_no_function_over_six_parameters_without_its_reason():
    wide = {
        f"{path}:{node.name}": len(parameters(node))
        for path, node in functions(("hf2triton", "cli", "flows", "tasks"))
        if len(parameters(node)) > MAX_PARAMS
    }
    assert set(wide) <= WIDE, {k: v for k, v in wide.items() if k not in WIDE}
    for name in WIDE & set(wide):
        path, func = name.split(":")
        lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
        at = next(i for i, line in enumerate(lines) if f"def {func}(" in line)
        assert lines[at - 1].lstrip().startswith("#"), f"{name}: no reason written above its def"


def test_the_pipelines_data_is_never_typed_any():
    untyped = [
        f"{path}:{node.lineno} {node.name}({p.arg})"
        for path, node in functions(("hf2triton", "flows", "tasks"))
        for p in parameters(node)
        if p.arg in DATA and p.annotation is not None and ast.unparse(p.annotation) == "Any"
    ]
    assert not untyped, untyped


def test_the_steps_results_name_their_fields():
    """What travels between the steps (hf2triton.release.results) has a type for each field."""
    tree = ast.parse((ROOT / "hf2triton/release/results.py").read_text(encoding="utf-8"))
    fields = {
        f"{cls.name}.{f.target.id}": ast.unparse(f.annotation)
        for cls in tree.body
        if isinstance(cls, ast.ClassDef)
        for f in cls.body
        if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)
    }
    assert {"Built.src", "Built.val", "Built.repo", "ReleaseContext.kind"} <= set(fields)
    assert not [k for k, v in fields.items() if v == "Any"], fields


def namesakes() -> tuple[list[Path], list[Path]]:
    """The modules over 40 lines (hf2triton/, cli/, flows/, tasks/), and those with a test
    module of their name."""
    found = [
        p
        for folder in ("hf2triton", "cli", "flows", "tasks")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p.read_text(encoding="utf-8").count("\n") > 40
    ]
    tests = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    return found, [p for p in found if f"test_{p.stem}.py" in tests]


def test_most_modules_have_a_namesake_test():
    found, tested = namesakes()
    missing = sorted(str(p.relative_to(ROOT)) for p in found if p not in tested)
    assert len(tested) >= NAMESAKE_SHARE * len(found), (len(tested), len(found), missing)
