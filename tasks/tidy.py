"""Step `tidy`: once the release serves, its work folder keeps only what ships and what a re-run
reuses, within twice what ships (hf2triton.release.tidy)."""

from __future__ import annotations

from prefect import task

from hf2triton.release.results import Built, ReleaseContext
from hf2triton.release.tidy import Tidied, tidy_work
from hf2triton.util.runs import NO_PREFECT_CACHE
from hf2triton.util.workspace import tree_size


@task(name="tidy", task_run_name="tidy the work folder", **NO_PREFECT_CACHE)
def tidy(ctx: ReleaseContext, built: Built) -> Tidied:
    graphs = [built.exp["onnx_path"], *(v.get("onnx_path", "") for v in built.variants)]
    ships = tree_size(built.repo["repository"])
    return tidy_work(ctx.work, built.val, [g for g in graphs if g], ships)
