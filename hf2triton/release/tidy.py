"""The work folder of a finished release keeps what ships and what a re-run reuses, within a
budget: the graphs the gate built itself and did not ship (the fastest runtime's other variants)
are removed; then, while the folder is over twice what ships (and over what ships plus
`REUSE_ALLOWANCE`), the graphs the steps before the gate made and did not ship go too, largest
first: the fp32 export an int8 graph was made from, each runtime's first variant. A re-run of
the same release builds those again, byte for byte the same, and so still reuses the gate's
verdict (its key holds the graphs' bytes and places). Each step folder is removed whole (renamed
aside first: a step folder is finished or absent), and the summary says how much was removed,
which steps a re-run makes again, and how much the work folder keeps."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TypedDict

from hf2triton.release.gate import GateResult
from hf2triton.util.runs import step_logger
from hf2triton.util.workspace import size_text, tree_size

# Reusable graphs up to this much beyond what ships are kept whatever the ratio: a small model's
# export (MiniLM's 90 MB beside a 23 MB int8 graph) costs little and makes a re-run seconds long.
REUSE_ALLOWANCE = 512 * 2**20
# The work folder's bound as a multiple of what ships (issue 46: disk left <= 2x what ships).
WORK_PER_SHIPPED = 2.0


class Tidied(TypedDict):
    removed_bytes: int  # what removing the unshipped graphs freed
    work_bytes: int  # what the release's work folder keeps
    rebuilt_on_rerun: list[str]  # the steps whose graphs went over budget: a re-run redoes them


def step_folder(work: Path, path: str) -> Path | None:
    """The step folder (<work>/<step>/<key>) `path` lies in; None outside the work folder."""
    try:
        parts = Path(path).resolve().relative_to(work.resolve()).parts
    except ValueError:
        return None
    return work / parts[0] / parts[1] if len(parts) >= 2 else None


def _remove(folder: Path) -> int:
    """Remove a step folder whole; its size, or 0 where it stays (the release serves already:
    a folder left is no failure)."""
    size = tree_size(folder)
    try:
        aside = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
        os.replace(folder, aside / folder.name)
    except OSError as exc:
        step_logger().warning("tidy: %s stays: %s", folder, exc)
        return 0
    shutil.rmtree(aside, ignore_errors=True)
    return size


def tidy_work(
    work: str, val: GateResult, reusable: list[str] | None = None, ships: int = 0
) -> Tidied:
    """Remove the step folders of the graphs the gate built and did not ship; then, while the
    work folder is over budget for `ships` bytes shipped, those of the `reusable` graphs (the
    export and the quantize step's) that did not ship, largest first."""
    root, log = Path(work), step_logger()
    start = tree_size(root)
    keep = step_folder(root, val["onnx_path"])
    for path in val["built"]:
        folder = step_folder(root, path)
        if folder is not None and folder != keep and folder.is_dir():
            _remove(folder)
    kept = tree_size(root)
    budget = max(WORK_PER_SHIPPED * ships, ships + REUSE_ALLOWANCE)
    folders = {step_folder(root, p) for p in reusable or []} - {None, keep}
    over = sorted((f for f in folders if f is not None and f.is_dir()), key=tree_size, reverse=True)
    again: list[str] = []
    for folder in over:
        if not ships or kept <= budget:
            break
        if _remove(folder):
            kept = tree_size(root)
            again.append(folder.parent.name)
    # What the disk got back: a file the repository links stays (tree_size counts it once).
    removed = start - kept
    if again:
        log.info(
            "tidy: the unshipped graphs of %s removed to keep the work folder within %gx what "
            "ships (%s): a re-run of this release makes them again, the same bytes, and reuses "
            "the gate's verdict",
            ", ".join(sorted(set(again))),
            WORK_PER_SHIPPED,
            size_text(ships),
        )
    log.info(
        "tidy: removed %s of graphs that did not ship; the work folder keeps %s",
        size_text(removed),
        size_text(kept),
    )
    return Tidied(removed_bytes=removed, work_bytes=kept, rebuilt_on_rerun=sorted(set(again)))
