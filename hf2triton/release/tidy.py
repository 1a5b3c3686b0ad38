"""The work folder of a finished release keeps what ships and what a re-run reuses: the export,
each runtime's first variant (the quantize step's), the gate's evidence and the repository. The
graphs the gate built itself and did not ship (the fastest runtime's other variants) are
removed, each step folder whole (renamed aside first: a step folder is finished or absent), and
the summary says how much was removed and how much the work folder keeps."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TypedDict

from hf2triton.release.gate import GateResult
from hf2triton.util.runs import step_logger
from hf2triton.util.workspace import size_text, tree_size


class Tidied(TypedDict):
    removed_bytes: int  # the unshipped graphs the gate built, removed
    work_bytes: int  # what the release's work folder keeps


def step_folder(work: Path, path: str) -> Path | None:
    """The step folder (<work>/<step>/<key>) `path` lies in; None outside the work folder."""
    try:
        parts = Path(path).resolve().relative_to(work.resolve()).parts
    except ValueError:
        return None
    return work / parts[0] / parts[1] if len(parts) >= 2 else None


def tidy_work(work: str, val: GateResult) -> Tidied:
    """Remove the step folders of the graphs the gate built and did not ship."""
    root, removed = Path(work), 0
    keep = step_folder(root, val["onnx_path"])
    for path in val["built"]:
        folder = step_folder(root, path)
        if folder is None or folder == keep or not folder.is_dir():
            continue
        size = tree_size(folder)
        try:
            aside = Path(
                tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp")
            )
            os.replace(folder, aside / folder.name)
        except OSError as exc:  # the release serves already: a folder left is no failure
            step_logger().warning("tidy: %s stays: %s", folder, exc)
            continue
        shutil.rmtree(aside, ignore_errors=True)
        removed += size
    kept = tree_size(root)
    step_logger().info(
        "tidy: removed %s of graphs the gate built and did not ship; the work folder keeps %s",
        size_text(removed),
        size_text(kept),
    )
    return Tidied(removed_bytes=removed, work_bytes=kept)
