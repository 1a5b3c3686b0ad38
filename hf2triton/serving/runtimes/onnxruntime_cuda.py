"""ONNX Runtime's CUDA provider (onnxruntime-gpu) on one GPU."""

from __future__ import annotations

from .base import Runtime, register
from .onnxruntime import OnnxRuntime


@register
class OnnxRuntimeCuda(OnnxRuntime):
    """ONNX Runtime's CUDA provider (onnxruntime-gpu) on GPU `device_id`; fp32 or fp16 graphs.

    `pad_to`: each run's token width padded up to a multiple of it and its rows up to a power of
    two (0: off), the shapes warmed when the model loads. On an H200 (2026-11-27, MiniLM's fused
    fp16 graph, ONNX Runtime 1.31.1) two thirds of a served instance's time went to NVRTC: the
    provider compiles kernels for each new input shape, and served batches come in hundreds of
    shapes. Batches as the serving core cuts them ran at 646 texts/s with each shape new, 19,349
    once every shape had been seen, and 8,580 padded to 17 buckets first seen
    (benchmarks/gpu/check_ort.py; docs/benchmarks.md)."""

    name = "onnxruntime-cuda"
    devices = ("cuda",)
    precisions = ("fp32", "fp16")
    options = {"threads": 0, "device_id": 0, "pad_to": 32}
    at_least = {**Runtime.at_least, "pad_to": 0}
    provider = "CUDAExecutionProvider"

    @classmethod
    def providers(cls, settings, shapes=None):
        return [
            (cls.provider, {"device_id": settings.options["device_id"]}),
            "CPUExecutionProvider",
        ]
