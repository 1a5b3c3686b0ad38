"""Step `write-render`: the release's repository, its image build context and render.json in one
folder, for a render-only run (hf2triton.release.render); nothing is registered or deployed."""

from __future__ import annotations

from prefect import task

from hf2triton.release.render import RenderResult, write_render
from hf2triton.release.results import Built
from hf2triton.spec import ReleaseSpec
from hf2triton.util.runs import NO_PREFECT_CACHE, step_logger


@task(name="write-render", task_run_name="write-render {output}", **NO_PREFECT_CACHE)
def write_output(spec: ReleaseSpec, built: Built, output: str) -> RenderResult:
    """The release's repository, its image's build context and render.json in `output`."""
    done = write_render(spec, built, output)
    step_logger().info(
        "render: %s (%s, %d instance(s), %s) in %s",
        done["model_name"],
        done["candidate"],
        done["instance_count"],
        spec.deploy.device,
        done["output"],
    )
    return done
