"""Step `write-render`: the release's repository, its image build context and render.json in one
folder, for a render-only run (hf2triton.release.render); nothing is registered or deployed."""

from __future__ import annotations

from prefect import task

from hf2triton.release.gate import GateResult
from hf2triton.release.render import RenderResult, write_render
from hf2triton.release.repository import RepositoryResult
from hf2triton.release.tuning import TuneResult
from hf2triton.sources import FetchResult
from hf2triton.spec import ReleaseSpec
from hf2triton.util.runs import NO_PREFECT_CACHE, step_logger


@task(name="write-render", task_run_name="write-render {output}", **NO_PREFECT_CACHE)
def write_output(
    spec: ReleaseSpec,
    src: FetchResult,
    val: GateResult,
    tuned: TuneResult | None,
    repo: RepositoryResult,
    output: str,
) -> RenderResult:
    done = write_render(
        spec, dict(src), dict(val), dict(tuned) if tuned else None, dict(repo), output
    )
    step_logger().info(
        "render: %s (%s, %d instance(s), %s) in %s",
        done["model_name"],
        done["candidate"],
        done["instance_count"],
        spec.deploy.device,
        done["output"],
    )
    return done
