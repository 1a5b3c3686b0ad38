"""ONNX Runtime's TensorRT provider on NVIDIA GPUs: fp16 engines, built when the model opens from
the plain fp16 graph the CUDA plug-in builds (hf2triton.runtimes.onnxruntime_cuda). It serves
deploy.device gpu, only when listed."""

from __future__ import annotations

from hf2triton.runtimes.base import FP16, PLUGINS, Recipe, VariantContext
from hf2triton.runtimes.onnxruntime_cuda import OnnxRuntimeCuda
from hf2triton.serving import runtimes as serving_runtimes


@PLUGINS.register
class OnnxRuntimeTensorrt(OnnxRuntimeCuda):
    serving = serving_runtimes.OnnxRuntimeTensorrt
    auto = ()  # only when listed: its engines are tied to the GPU, driver and TensorRT version
    # Not the fused graph: TensorRT has no kernels for ONNX Runtime's own operators.
    reads = {"fp16": frozenset({FP16})}

    @classmethod
    def recipes(cls, ctx: VariantContext) -> list[Recipe]:
        return [r for r in super().recipes(ctx) if r.graph in cls.reads["fp16"]]
