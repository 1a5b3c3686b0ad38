"""ONNX Runtime's CUDA provider (onnxruntime-gpu) on one GPU."""

from __future__ import annotations

from .base import register
from .onnxruntime import OnnxRuntime


@register
class OnnxRuntimeCuda(OnnxRuntime):
    """ONNX Runtime's CUDA provider (onnxruntime-gpu) on GPU `device_id`; fp32 or fp16 graphs."""

    name = "onnxruntime-cuda"
    devices = ("cuda",)
    precisions = ("fp32", "fp16")
    options = {"threads": 0, "device_id": 0}
    provider = "CUDAExecutionProvider"

    @classmethod
    def providers(cls, settings, shapes=None):
        return [
            (cls.provider, {"device_id": settings.options["device_id"]}),
            "CPUExecutionProvider",
        ]
