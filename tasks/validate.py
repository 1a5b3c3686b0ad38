"""Step `validate`: the accuracy gate (hf2triton.gate). The candidates are the quantized
variants and, with a fallback or a search, the fp32 export; the kind scores each against PyTorch
as Triton will run it and the first (or with a search, the fastest) that passes ships."""

from __future__ import annotations

from typing import Any

from prefect import task

from hf2triton.champion import find_champion
from hf2triton.clients.mlflow import tracking_uri
from hf2triton.export import ExportResult
from hf2triton.gate import GateResult, run_gate
from hf2triton.kinds import Candidate, Data, ModelKind
from hf2triton.runs import NO_PREFECT_CACHE, RETRY_TRANSIENT, note_reuse, step_logger
from hf2triton.spec import QuantizationSpec


def candidates(exp: ExportResult, variants: list[dict[str, Any]],
               quantization: QuantizationSpec) -> list[Candidate]:
    found = [Candidate(name=v["method"], onnx_path=v["onnx_path"]) for v in variants]
    if quantization.method != "none" and (quantization.fallback_to_fp32 or quantization.search):
        found.append(Candidate(name="fp32", onnx_path=exp["onnx_path"]))
    return found


@task(name="validate", task_run_name="validate {kind.name}: the accuracy gate", **RETRY_TRANSIENT,
      **NO_PREFECT_CACHE)
def validate(kind: ModelKind, model_dir: str, exp: ExportResult, variants: list[dict[str, Any]],
             data: Data, quantization: QuantizationSpec, deploy: Any, work: str) -> GateResult:
    """Gate the candidates; raises AccuracyGateError (with a report) when none passes."""
    cfg = kind.config_from_dict(exp["config"])
    # With labelled data, the candidate also faces the serving champion.
    champion = find_champion(kind.spec.registry.model_name, tracking_uri()) \
        if kind.labelled_metrics(kind.gate_data(data, cfg)) else None
    found = run_gate(kind, model_dir, exp["export_dir"], candidates(exp, variants, quantization),
                     cfg, data, deploy.max_batch_size, deploy.max_batch_tokens,
                     work, "fastest" if quantization.search else "first", champion,
                     kind.spec.validation.max_drop)
    note_reuse("validate", found)
    step_logger().info("validate: ships %s (%s)", found["chosen"], ", ".join(
        f"{k} {v:.4f}" for k, v in found["metrics"].items() if k in kind.limits()))
    return found
