"""Steps `deploy`, `smoke` and `retire-previous`, for every target (hf2triton.targets): the new
version serves beside the old one, the smoke test checks that it serves what the gate judged (the
shipped candidate's own answers, recorded by the gate: hf2triton.targets.smoke), and only after
promotion does the old one go. Deploy,
smoke and promote run in one Prefect transaction: if anything after deploy fails, the rollback
hook below puts the target back to what served before."""

from __future__ import annotations

from collections.abc import Callable

from prefect import task
from prefect.transactions import BaseTransaction, get_transaction

from hf2triton.kinds import ModelKind
from hf2triton.kinds.config import KindConfig
from hf2triton.release.gate import GateResult
from hf2triton.release.repository import RepositoryResult
from hf2triton.targets import Deployment, DeployTarget
from hf2triton.targets.smoke import Endpoint, smoke_endpoint, smoke_test
from hf2triton.util.json_types import JSONObject
from hf2triton.util.runs import NO_PREFECT_CACHE, RETRY_TRANSIENT, note_reuse, step_logger


def _check(
    target: DeployTarget, kind: ModelKind[KindConfig], model_name: str, reference_path: str
) -> Callable[[Endpoint], dict[str, float]]:
    import json

    with open(reference_path, encoding="utf-8") as f:
        reference = json.load(f)
    key = target.spec.openai.client_key()
    return lambda endpoint: smoke_endpoint(kind, endpoint, model_name, reference, key)


@task(
    name="deploy",
    task_run_name="deploy {repo[model_name]} v{version} to {target.name}",
    **RETRY_TRANSIENT,
    **NO_PREFECT_CACHE,
)
def deploy(
    target: DeployTarget,
    kind: ModelKind[KindConfig],
    repo: RepositoryResult,
    version: str,
    image: JSONObject,
    val: GateResult,
) -> Deployment:
    """Put `version` beside what serves (a load that fails cleans up after itself)."""
    deployment = target.deploy(
        repo["repository"],
        repo["model_name"],
        version,
        repo["files"],
        image,
        _check(target, kind, repo["model_name"], val["reference_path"]),
    )
    txn = get_transaction()
    if txn is not None:
        txn.set("rollback", (target, deployment))
    note_reuse("deploy", deployment)
    return deployment


@deploy.on_rollback
def rollback(txn: BaseTransaction) -> None:
    """Something after deploy failed: back to what served before (a version that was already
    serving before this run is left alone)."""
    target, deployment = txn.get("rollback", (None, None))
    if target is not None and not deployment["reused"]:
        step_logger().warning(
            "deploy: rolling %s back; the previous version keeps serving", target.name
        )
        target.rollback(deployment)


@task(
    name="smoke",
    task_run_name="smoke {deployment[model_name]} v{deployment[version]}",
    **RETRY_TRANSIENT,
    **NO_PREFECT_CACHE,
)
def smoke(
    target: DeployTarget, kind: ModelKind[KindConfig], deployment: Deployment, val: GateResult
) -> dict[str, float]:
    """The deployed version on every endpoint against what the gate recorded the shipped
    candidate answering the same requests."""
    endpoints: list[Endpoint] = deployment["endpoints"]
    figures = smoke_test(
        kind,
        endpoints,
        deployment["model_name"],
        val["reference_path"],
        target.spec.openai.client_key(),
    )
    step_logger().info(
        "smoke: %d endpoint(s) serve what the gate judged (%s) over gRPC, HTTP%s (%s; gRPC "
        "p50 %.1f ms)",
        len(endpoints),
        val["chosen"],
        " and the OpenAI-compatible API" if "openai_p50_ms" in figures else "",
        ", ".join(f"{k} {figures[k]:.4f}" for k in kind.agreement_limits(0.0) if k in figures),
        figures.get("grpc_p50_ms", float("nan")),
    )
    return figures


@task(
    name="retire-previous",
    task_run_name="retire-previous {deployment[model_name]}",
    **RETRY_TRANSIENT,
    **NO_PREFECT_CACHE,
)
def retire(target: DeployTarget, deployment: Deployment) -> list[str]:
    """After promotion: what served before stops serving (kept on disk where it can be)."""
    retired = target.retire(deployment)
    if retired:
        step_logger().info(
            "deploy: version %s serves; retired version(s) %s",
            deployment["version"],
            ", ".join(retired),
        )
    return retired
