"""Quantize step: ONNX Runtime dynamic int8 quantization of the exported model (or a plain copy of
the fp32 model when the spec says `method: none`).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import TypedDict

from prefect import task

from hf2triton.errors import QuantizationError
from hf2triton.spec import QuantizationSpec
from hf2triton.workspace import cached_step, digest, sha256_file, source_digest
from tasks.common import NO_PREFECT_CACHE



class QuantizeResult(TypedDict):
    onnx_path: str
    method: str
    fp32_bytes: int
    size_bytes: int
    sha256: str
    seconds: float
    reused: bool


def quantize_onnx(onnx_path: str, spec: QuantizationSpec, work_root: str) -> QuantizeResult:
    """Write the quantized model for `onnx_path` and return where it is."""
    src = Path(onnx_path)
    key = digest([sha256_file(src), spec.model_dump(), source_digest(sys.modules[__name__])])
    started = time.perf_counter()

    def build(out: Path) -> dict:
        target = out / "model.onnx"
        if spec.method == "none":
            shutil.copyfile(src, target)
            return {}
        from onnxruntime.quantization import QuantType, quantize_dynamic

        try:
            quantize_dynamic(
                src, target,
                weight_type=QuantType.QInt8 if spec.weight_type == "qint8" else QuantType.QUInt8,
                per_channel=spec.per_channel,
                reduce_range=spec.reduce_range,
                op_types_to_quantize=spec.op_types,
            )
        except Exception as exc:  # ORT raises plain Exceptions for unsupported graphs
            raise QuantizationError(
                f"dynamic int8 quantization of {src} failed: {exc}. Set quantization.method: "
                "none to ship fp32, or change quantization.op_types"
            ) from exc
        return {}

    done = cached_step(work_root, "quantize", key, build)
    path = done.path / "model.onnx"
    return QuantizeResult(
        onnx_path=str(path),
        method=spec.method if spec.method == "none" else (
            f"dynamic-int8/{spec.weight_type}/"
            f"{'per-channel' if spec.per_channel else 'per-tensor'}"
            f"{'/reduce-range' if spec.reduce_range else ''}"
            f"{'/' + '+'.join(spec.op_types) if spec.op_types else ''}"
        ),
        fp32_bytes=src.stat().st_size,
        size_bytes=path.stat().st_size,
        sha256=done.files["model.onnx"],
        seconds=round(time.perf_counter() - started, 3),
        reused=done.reused,
    )


quantize = task(quantize_onnx, name="quantize", **NO_PREFECT_CACHE)
