"""Step `build-repository`: the Triton model repository of the release, with the validated
model, the serving core the gate ran, serving.json and the batching the deploy section (or the
configuration search) chose (hf2triton.release.repository)."""

from __future__ import annotations

from prefect import task

from hf2triton.release.gate import GateResult
from hf2triton.release.repository import BATCHING, RepositoryResult, build_repository
from hf2triton.release.results import Exported, ReleaseContext, Shipped
from hf2triton.release.traffic import warmup_items
from hf2triton.release.tuning import TuneResult
from hf2triton.targets import DeploySection
from hf2triton.util.runs import NO_PREFECT_CACHE, note_reuse


@task(name="build-repository", task_run_name="build-repository {model_name}", **NO_PREFECT_CACHE)
def repository(
    ctx: ReleaseContext,
    exp: Exported,
    val: GateResult,
    deploy: DeploySection,
    tuned: TuneResult | None,
    model_name: str,
) -> RepositoryResult:
    """The repository of the candidate the gate chose, batched as `deploy` (or the search)
    says; what the gate ran is what serves."""
    knobs = {k: getattr(deploy, k) for k in BATCHING}
    knobs.update(tuned["chosen"] if tuned else {})
    built = build_repository(
        Shipped.judged(ctx.kind, exp, val),
        model_name,
        knobs,
        warmup_items(ctx.data.items, ctx.kind.item_size),
        ctx.work,
    )
    note_reuse("build-repository", built)
    return built
