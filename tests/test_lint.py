"""Lint and types, as the test command runs them (so CI fails on either): `ruff check` and
`ruff format --check` on the code and the tests, and mypy on hf2triton/ (cli/, flows/ and tasks/
as the package maps them) and benchmarks/, with pyproject.toml's settings.

mypy cannot follow setuptools' package-dir mapping (cli/ installed as hf2triton.cli), so it
reads a tree of links laid out as the installed package is; its cache lives in the work tree's
ignored .cache/mypy, so a second run takes seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

BIN = Path(sys.executable).parent
CHECKED = [
    "hf2triton",
    "cli",
    "flows",
    "tasks",
    "benchmarks",
    "tests",
    "docs",
    "infra",
    "model_repository",
]


def _run(cmd: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing_to_fix():
    found = _run([str(BIN / "ruff"), "check", "--output-format", "concise", *CHECKED])
    assert found.returncode == 0, found.stdout[-6000:] + found.stderr[-2000:]


def test_the_code_is_formatted_as_ruff_formats_it():
    found = _run([str(BIN / "ruff"), "format", "--check", *CHECKED])
    assert found.returncode == 0, (
        found.stdout[-6000:] + "\nrun `.venv/bin/ruff format` to format these files"
    )


def installed_layout(at: Path) -> Path:
    """Links to the checkout laid out as the installed package: hf2triton/ with cli/, flows/
    and tasks/ inside it, benchmarks/ beside it, and pyproject.toml."""
    package = at / "hf2triton"
    package.mkdir(parents=True)
    for entry in (ROOT / "hf2triton").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for folder in ("cli", "flows", "tasks"):
        (package / folder).symlink_to(ROOT / folder)
    (at / "benchmarks").symlink_to(ROOT / "benchmarks")
    (at / "pyproject.toml").symlink_to(ROOT / "pyproject.toml")
    return at


def test_mypy_finds_no_type_error(tmp_path):
    tree = installed_layout(tmp_path / "tree")
    cache = ROOT / ".cache" / "mypy"
    found = _run(
        [str(BIN / "mypy"), "hf2triton", "benchmarks", "--cache-dir", str(cache)], cwd=tree
    )
    assert found.returncode == 0, (
        (found.stdout[-8000:] + found.stderr[-2000:])
        .replace("hf2triton/cli/", "cli/")
        .replace("hf2triton/flows/", "flows/")
        .replace("hf2triton/tasks/", "tasks/")
    )
    assert "Success: no issues found" in found.stdout
