"""Step `monitoring`: the release's Prometheus scrape config, alert rules (and their promtool
tests) and Grafana dashboard, rendered from its `watch:` budgets (hf2triton.watch.monitoring)
beside its other outputs and logged to its MLflow run under `monitoring/`."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from hf2triton.clients.mlflow import Registry
from hf2triton.spec import ReleaseSpec
from hf2triton.targets import DeployTarget
from hf2triton.tasks.register import RegisterResult
from hf2triton.util.runs import NO_PREFECT_CACHE, RETRY_TRANSIENT, step_logger
from hf2triton.watch import monitoring as render


@task(
    name="monitoring", task_run_name="monitoring {spec.name}", **RETRY_TRANSIENT, **NO_PREFECT_CACHE
)
def monitoring(spec: ReleaseSpec, target: DeployTarget, reg: RegisterResult) -> dict[str, str]:
    out = Path(target.work) / "monitoring" / reg["version"]
    written = render.write(spec, target.watch_points(), out)
    Registry(reg["tracking_uri"]).log_artifacts(reg["run_id"], str(out), "monitoring")
    step_logger().info("monitoring: Prometheus rules and Grafana dashboard in %s", out)
    return written
