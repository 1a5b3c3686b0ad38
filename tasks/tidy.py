"""Step `tidy`: once the release serves, its work folder keeps only what ships and what a re-run
reuses (hf2triton.release.tidy)."""

from __future__ import annotations

from prefect import task

from hf2triton.release.gate import GateResult
from hf2triton.release.results import ReleaseContext
from hf2triton.release.tidy import Tidied, tidy_work
from hf2triton.util.runs import NO_PREFECT_CACHE


@task(name="tidy", task_run_name="tidy the work folder", **NO_PREFECT_CACHE)
def tidy(ctx: ReleaseContext, val: GateResult) -> Tidied:
    return tidy_work(ctx.work, val)
