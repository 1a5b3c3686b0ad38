"""Step `quantize`: the graph variants the release's runtimes build (hf2triton.runtimes: the
spec's quantized variant and, with `quantization.search`, the grid for ONNX Runtime; NNCF int8
for OpenVINO; fp16 for a GPU), then the export itself."""

from __future__ import annotations

from prefect import task

from hf2triton.release.results import Exported, ReleaseContext
from hf2triton.runtimes import Variant, VariantContext, build_variants
from hf2triton.sources import FetchResult
from hf2triton.spec import QuantizationSpec
from hf2triton.util.runs import NO_PREFECT_CACHE, note_reuse, step_logger


@task(name="quantize", task_run_name="quantize {spec.method}", **NO_PREFECT_CACHE)
def quantize(
    ctx: ReleaseContext, src: FetchResult, exp: Exported, spec: QuantizationSpec
) -> list[Variant]:
    """The variants to gate; one whose build fails is kept with why (the gate refuses it)."""
    variants = build_variants(
        VariantContext(
            onnx_path=exp["onnx_path"],
            export_dir=exp["export_dir"],
            model_dir=src["model_dir"],
            kind=ctx.kind,
            quantization=spec,
            calibration=ctx.kind.calibration(ctx.data),
            max_length=exp["config"].get("max_length"),
            work=ctx.work,
        ),
        ctx.runtimes,
    )
    log = step_logger()
    for v in variants:
        if v.get("error"):
            log.warning("quantize: %s: %s; the gate refuses it", v["method"], v["error"])
    note_reuse("quantize", variants[0])
    return variants
