"""ONNX Runtime on NVIDIA GPUs: the CUDA provider (fp32, and the fp16 graph this module builds)
and the TensorRT provider (fp16 engines, built when the model opens). Both serve deploy.device
gpu; with `deploy.gpu_gate: cpu-numerics` the gate checks their graphs on ONNX Runtime's CPU
provider at the same precision (hf2triton.runtimes.devices)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from hf2triton.runtimes import RUNTIMES
from hf2triton.runtimes.base import (
    FP16,
    PLAIN,
    Recipe,
    RuntimePlugin,
    Variant,
    VariantContext,
    build_variant,
)
from hf2triton.util.workspace import sha256_file


@RUNTIMES.register
class OnnxRuntimeCuda(RuntimePlugin):
    name = "onnxruntime-cuda"
    device = "gpu"
    auto: ClassVar[tuple[str, ...]] = ("fp32", "fp16")
    reads = {"fp32": frozenset({PLAIN}), "fp16": frozenset({FP16})}

    @classmethod
    def recipes(cls, ctx: VariantContext) -> list[Recipe]:
        if not ctx.single_file:
            return []
        return [Recipe("fp16", FP16, lambda: fp16_graph(ctx.onnx_path, ctx.work))]


@RUNTIMES.register
class OnnxRuntimeTensorrt(OnnxRuntimeCuda):
    name = "onnxruntime-tensorrt"
    auto = ()  # only when listed: its engines are tied to the GPU, driver and TensorRT version
    reads = {"fp16": frozenset({FP16})}


# Kept in fp32 in the fp16 graph: what overflows or loses too much in half precision
# (LayerNorm's variance, Softmax's exponent, the decomposed LayerNorm's Pow and ReduceMean).
FP16_KEEP = [
    "LayerNormalization",
    "SkipLayerNormalization",
    "SimplifiedLayerNormalization",
    "Softmax",
    "Pow",
    "ReduceMean",
]


def fp16_graph(onnx_path: str, work_root: str) -> Variant:
    """The graph in fp16 for a GPU runtime, with fp32 inputs and outputs kept (the serving core
    feeds and reads fp32) and the overflow-prone ops in fp32 (onnxruntime.transformers.float16).
    On a CPU ONNX Runtime runs it through casts: the gate's CPU numerics check."""
    src = Path(onnx_path)

    def build(out: Path) -> dict:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(
            onnx.load(str(src)), keep_io_types=True, op_block_list=FP16_KEEP
        )
        # The converter names the Cast it puts before each blocked consumer of a tensor after
        # the tensor alone: two consumers give two nodes of one name, which ONNX refuses.
        seen: dict[str, int] = {}
        for node in model.graph.node:
            count = seen[node.name] = seen.get(node.name, 0) + 1
            if node.name and count > 1:
                node.name = f"{node.name}_{count}"
        onnx.save(model, str(out / "model.onnx"))
        return {}

    return build_variant(
        work_root, "fp16", [sha256_file(src), FP16_KEEP], build, "fp16", FP16, "model.onnx", src
    )
