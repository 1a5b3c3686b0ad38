"""Step `quantize`: the spec's int8 variant of the exported model, and with
`quantization.search` the whole variant grid (hf2triton.quantization)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from hf2triton.devices import RuntimeChoices
from hf2triton.export import ExportResult
from hf2triton.quantization import QuantizeResult, quantize_variants
from hf2triton.runs import NO_PREFECT_CACHE, note_reuse
from hf2triton.spec import QuantizationSpec


@task(name="quantize", task_run_name="quantize {spec.method}", **NO_PREFECT_CACHE)
def quantize(exp: ExportResult, spec: QuantizationSpec, runtimes: RuntimeChoices,
             calibration: list[Any] | None, work: str) -> list[QuantizeResult]:
    """The variants to gate: the spec's own first (for a GPU also the fp16 graph; where
    OpenVINO runs and the kind gives calibration texts, OpenVINO's int8 graph)."""
    openvino = (str(Path(exp["export_dir"]) / "tokenizer.json"), exp["config"]["max_length"],
                calibration) if calibration and runtimes.runs("openvino") else None
    variants = quantize_variants(exp["onnx_path"], spec, work, runtimes.device, openvino)
    note_reuse("quantize", variants[0])
    return variants
