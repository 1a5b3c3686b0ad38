"""Steps `register` and `promote`: one MLflow run and one model version per distinct release,
carrying the whole release record (hf2triton.release.record), alias `candidate`; after the smoke
test the new version becomes what clients reach and `champion` moves to it
(hf2triton.clients.mlflow)."""

from __future__ import annotations

from prefect import task

from hf2triton.clients.mlflow import Registry
from hf2triton.release.record import Record
from hf2triton.release.results import RegisterResult
from hf2triton.spec import RegistrySpec
from hf2triton.targets import Deployment, DeployTarget
from hf2triton.util.runs import NO_PREFECT_CACHE, RETRY_TRANSIENT, step_logger
from hf2triton.watch.registry import promote as record_promotion

__all__ = ["RegisterResult", "promote", "register"]


@task(
    name="register",
    task_run_name="register {registry.model_name}",
    **RETRY_TRANSIENT,
    **NO_PREFECT_CACHE,
)
def register(registry: RegistrySpec, record: Record) -> RegisterResult:
    """Log the release and register a model version, unless a complete one with the same
    release key exists (then it is the candidate again). Retried when MLflow does not answer:
    what a stopped attempt left is finished or deleted first, never reused half-written
    (Registry.settle_attempts)."""
    result = RegisterResult(
        **Registry().register_release(registry.model_name, registry.experiment, record)
    )
    step_logger().info(
        "register: %s version %s%s",
        result["model_name"],
        result["version"],
        " (already registered: same release key)" if result["reused"] else "",
    )
    return result


@task(
    name="promote",
    task_run_name="promote {reg[model_name]} v{reg[version]}",
    **RETRY_TRANSIENT,
    **NO_PREFECT_CACHE,
)
def promote(
    target: DeployTarget, deployment: Deployment, reg: RegisterResult, smoke: dict[str, float]
) -> Deployment:
    """The smoke test passed: the new version becomes what clients reach, its smoke figures go
    on the MLflow version, and the `champion` alias moves to it."""
    promoted = target.promote(deployment)
    record_promotion(Registry(reg["tracking_uri"]), reg["model_name"], reg["version"], smoke)
    step_logger().info("promote: champion is now %s version %s", reg["model_name"], reg["version"])
    return promoted
