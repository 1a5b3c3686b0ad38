"""Step `tune-triton-config`: with `deploy.tuning.search`, the Triton batching and execution
settings measured on a private server; the fastest under the latency cap ships
(hf2triton.release.tuning). Without it, nothing runs and the deploy section's settings ship."""

from __future__ import annotations

from prefect import task

from hf2triton.release.gate import GateResult
from hf2triton.release.results import Exported, ReleaseContext, Shipped
from hf2triton.release.tuning import TuneResult, describe, tune_config
from hf2triton.targets import DeploySection
from hf2triton.util.runs import NO_PREFECT_CACHE, step_logger


@task(name="tune-triton-config", **NO_PREFECT_CACHE)
def tune(
    ctx: ReleaseContext, exp: Exported, val: GateResult, deploy: DeploySection, model_name: str
) -> TuneResult | None:
    """The shipped candidate's serving settings, searched when `deploy.tuning.search` asks."""
    if not deploy.tuning.search:
        return None
    shipped = Shipped.judged(ctx.kind, exp, val)
    tuned = tune_config(shipped, model_name, deploy, ctx.data, ctx.work)
    step_logger().info("tune: ships %s", describe(tuned["chosen"]))
    return tuned
