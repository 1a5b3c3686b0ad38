"""Step `tune-triton-config`: with `deploy.tuning.search`, the Triton batching and execution
settings measured on a private server; the fastest under the latency cap ships
(hf2triton.release.tuning). Without it, nothing runs and the deploy section's settings ship."""

from __future__ import annotations

from typing import Any

from prefect import task

from hf2triton.kinds import Data, ModelKind
from hf2triton.release.gate import GateResult
from hf2triton.release.traffic import search_items, warmup_items
from hf2triton.release.tuning import TuneResult, describe, tune_config
from hf2triton.tasks.export import Exported
from hf2triton.util.runs import NO_PREFECT_CACHE, step_logger


@task(name="tune-triton-config", **NO_PREFECT_CACHE)
def tune(
    kind: ModelKind,
    model_name: str,
    val: GateResult,
    exp: Exported,
    data: Data,
    deploy: Any,
    work: str,
) -> TuneResult | None:
    if not deploy.tuning.search:
        return None
    tuned = tune_config(
        kind,
        model_name,
        val["onnx_path"],
        exp["export_dir"],
        kind.config_from_dict(exp["config"]),
        val["info"],
        deploy,
        warmup_items(data.items),
        search_items(data.items),
        work,
        val.get("runtime"),
    )
    step_logger().info("tune: ships %s", describe(tuned["chosen"]))
    return tuned
