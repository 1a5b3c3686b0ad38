"""The tidy step (hf2triton/release/tidy.py): the step folders of the graphs the gate built and
did not ship go; the shipped one, the export, each runtime's first variant and the gate's
evidence stay; what was removed and kept is counted."""

from __future__ import annotations

from pathlib import Path

from hf2triton.release.tidy import tidy_work


def step(work: Path, name: str, key: str, size: int) -> Path:
    folder = work / name / key
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"\0" * size)
    (folder / "done.json").write_text("{}")
    return folder / "model.onnx"


def test_unshipped_graphs_the_gate_built_are_removed_and_counted(tmp_path):
    work = tmp_path / "work"
    export = step(work, "export", "a" * 16, 1000)
    first = step(work, "quantize", "b" * 16, 300)
    shipped = step(work, "quantize", "c" * 16, 200)
    other = step(work, "optimize", "d" * 16, 400)
    evidence = step(work, "validate", "e" * 16, 10)
    val = {"onnx_path": str(shipped), "built": [str(shipped), str(other)]}

    tidied = tidy_work(str(work), val)  # type: ignore[arg-type]

    assert not other.parent.exists()
    assert all(p.is_file() for p in (export, first, shipped, evidence))
    assert tidied["removed_bytes"] == 400 + 2
    kept = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
    assert tidied["work_bytes"] == kept
    assert not [p for p in work.rglob("*.tmp")]  # nothing half-removed left behind


def test_a_built_path_outside_the_work_folder_is_never_touched(tmp_path):
    outside = tmp_path / "elsewhere" / "model.onnx"
    outside.parent.mkdir()
    outside.write_bytes(b"x")
    work = tmp_path / "work"
    shipped = step(work, "quantize", "c" * 16, 5)
    tidy_work(str(work), {"onnx_path": str(shipped), "built": [str(outside)]})  # type: ignore[arg-type]
    assert outside.is_file() and shipped.is_file()
