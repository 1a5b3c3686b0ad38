"""Step `build-repository`: the Triton model repository of the release, with the validated
model, the serving core the gate ran, serving.json and the batching the deploy section (or the
configuration search) chose (hf2triton.release.repository)."""

from __future__ import annotations

from typing import Any

from prefect import task

from hf2triton.kinds import Data, ModelKind
from hf2triton.release.gate import GateResult
from hf2triton.release.repository import BATCHING, RepositoryResult, build_repository
from hf2triton.release.traffic import warmup_items
from hf2triton.release.tuning import TuneResult
from hf2triton.tasks.export import Exported
from hf2triton.util.runs import NO_PREFECT_CACHE, note_reuse


@task(name="build-repository", task_run_name="build-repository {model_name}", **NO_PREFECT_CACHE)
def repository(
    kind: ModelKind,
    model_name: str,
    val: GateResult,
    exp: Exported,
    data: Data,
    deploy: Any,
    tuned: TuneResult | None,
    work: str,
) -> RepositoryResult:
    knobs = {k: getattr(deploy, k) for k in BATCHING}
    knobs.update(tuned["chosen"] if tuned else {})
    knobs["runtime"] = val.get("runtime")  # what the gate ran is what serves
    built = build_repository(
        kind,
        model_name,
        val["onnx_path"],
        exp["export_dir"],
        kind.config_from_dict(exp["config"]),
        val["info"],
        knobs,
        warmup_items(data.items),
        work,
    )
    note_reuse("build-repository", built)
    return built
