"""Step `report`: the release report, the accuracy table and the MLflow links in the Prefect UI,
for every kind (hf2triton.release.report)."""

from __future__ import annotations

from prefect import task

from hf2triton.kinds import ModelKind
from hf2triton.kinds.config import KindConfig
from hf2triton.release.gate import GateResult
from hf2triton.release.report import publish_release_report
from hf2triton.util.json_types import JSONObject
from hf2triton.util.runs import NO_PREFECT_CACHE


@task(name="report", task_run_name="report {summary[release]}", **NO_PREFECT_CACHE)
def report(
    kind: ModelKind[KindConfig], summary: JSONObject, val: GateResult, experiment_id: str | None
) -> str:
    return publish_release_report(kind, summary, val["report_path"], experiment_id)
