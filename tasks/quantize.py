"""Step `quantize`: the graph variants the release's runtimes build (hf2triton.runtimes: the
spec's quantized variant and, with `quantization.search`, the grid for ONNX Runtime; NNCF int8
for OpenVINO; fp16 for a GPU), then the export itself."""

from __future__ import annotations

from typing import Any

from prefect import task

from hf2triton.kinds import ModelKind
from hf2triton.runtimes import RuntimeChoices, Variant, VariantContext, build_variants
from hf2triton.spec import QuantizationSpec
from hf2triton.tasks.export import Exported
from hf2triton.util.runs import NO_PREFECT_CACHE, note_reuse, step_logger


@task(name="quantize", task_run_name="quantize {spec.method}", **NO_PREFECT_CACHE)
def quantize(
    kind: ModelKind,
    model_dir: str,
    exp: Exported,
    spec: QuantizationSpec,
    runtimes: RuntimeChoices,
    calibration: list[Any] | None,
    work: str,
) -> list[Variant]:
    """The variants to gate; one whose build fails is kept with why (the gate refuses it)."""
    ctx = VariantContext(
        onnx_path=exp["onnx_path"],
        export_dir=exp["export_dir"],
        model_dir=model_dir,
        kind=kind,
        quantization=spec,
        calibration=calibration,
        max_length=exp["config"].get("max_length"),
        work=work,
    )
    variants = build_variants(ctx, runtimes)
    log = step_logger()
    for v in variants:
        if v.get("error"):
            log.warning("quantize: %s: %s; the gate refuses it", v["method"], v["error"])
    note_reuse("quantize", variants[0])
    return variants
