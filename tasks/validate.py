"""Step `validate`: the accuracy gate (hf2triton.release.gate) on the candidates
hf2triton.release.candidates names; the kind scores each against PyTorch as Triton will run it."""

from __future__ import annotations

from typing import Any

from prefect import task

from hf2triton.clients.mlflow import tracking_uri
from hf2triton.kinds import Data, ModelKind
from hf2triton.release.candidates import champion_to_face, gate_candidates, selection
from hf2triton.release.gate import GateResult, GateSettings, run_gate
from hf2triton.runtimes import RuntimeChoices, Variant
from hf2triton.spec import QuantizationSpec, ValidationSpec
from hf2triton.tasks.export import Exported
from hf2triton.util.runs import NO_PREFECT_CACHE, RETRY_TRANSIENT, note_reuse, step_logger


@task(
    name="validate",
    task_run_name="validate {kind.name}: the accuracy gate",
    **RETRY_TRANSIENT,
    **NO_PREFECT_CACHE,
)
def validate(
    kind: ModelKind,
    model_dir: str,
    exp: Exported,
    variants: list[Variant],
    data: Data,
    quantization: QuantizationSpec,
    deploy: Any,
    runtimes: RuntimeChoices,
    work: str,
    validation: ValidationSpec,
    model_name: str,
) -> GateResult:
    """Gate the candidates; raises AccuracyGateError (with a report) when none passes."""
    cfg = kind.config_from_dict(exp["config"])
    settings = GateSettings(
        batch=deploy.max_batch_size,
        max_batch_tokens=deploy.max_batch_tokens,
        select=selection(quantization, runtimes),
        max_drop=validation.max_drop,
        judge_all=validation.judge_all,
        not_offered=runtimes.not_offered,
    )
    found = run_gate(
        kind,
        gate_candidates(variants, quantization, runtimes),
        model_dir=model_dir,
        export_dir=exp["export_dir"],
        cfg=cfg,
        data=data,
        settings=settings,
        work_root=work,
        champion=champion_to_face(kind, data, cfg, tracking_uri(), model_name),
    )
    note_reuse("validate", found)
    step_logger().info(
        "validate: ships %s (%s)",
        found["chosen"],
        ", ".join(f"{k} {v:.4f}" for k, v in found["metrics"].items() if k in kind.limits()),
    )
    return found
