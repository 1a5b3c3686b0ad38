"""ONNX Runtime's CPU provider: the default runtime. It reads every ONNX graph, its own
quantized and fused ones too, and builds those variants (hf2triton.runtimes.quantizers): the
spec's own quantized variant, and with `quantization.search` the whole grid and the
ORT-optimised fp32 graphs (single-file models)."""

from __future__ import annotations

from functools import partial

from hf2triton.runtimes.base import (
    FP16,
    FP16_ORT,
    GENERATORS_TO_GENAI,
    ORT_ONLY,
    PLAIN,
    PLUGINS,
    Recipe,
    RuntimePlugin,
    VariantContext,
)
from hf2triton.runtimes.quantizers import (
    OPTIMIZATION_LEVELS,
    method_name,
    optimize_fp32,
    quantize_onnx,
    search_grid,
)
from hf2triton.serving import runtimes as serving_runtimes


@PLUGINS.register
class OnnxRuntimeCpu(RuntimePlugin):
    serving = serving_runtimes.OnnxRuntime
    device = "cpu"
    auto = ("fp32",)
    # fp16: the GPU graphs' numerics checked on the CPU (deploy.gpu_gate: cpu-numerics); its
    # fused operators run there too, through casts where a kernel has no fp16 version.
    reads = {"fp32": frozenset({PLAIN, ORT_ONLY}), "fp16": frozenset({FP16, FP16_ORT})}
    # the export and its graph-optimized copies: f32 weights all
    plain_weights = frozenset(
        {"fp32", "fp32/fused", *(f"fp32/ort-{level}" for level in OPTIMIZATION_LEVELS)}
    )
    yields_to = {"text_generation": GENERATORS_TO_GENAI}

    @classmethod
    def recipes(cls, ctx: VariantContext) -> list[Recipe]:
        spec = ctx.quantization
        # With method none the export itself is the spec's variant (no copy of it is made).
        own = [spec] if spec.method != "none" or spec.fuse else []
        specs = [*own, *(search_grid(spec) if spec.search and ctx.single_file else [])]
        found = [
            Recipe(method_name(s), ORT_ONLY, partial(quantize_onnx, ctx.onnx_path, s, ctx.work))
            for s in specs
        ]
        if spec.search and ctx.single_file:
            found += [
                Recipe(
                    f"fp32/ort-{level}",
                    ORT_ONLY,
                    partial(optimize_fp32, ctx.onnx_path, level, ctx.work),
                )
                for level in OPTIMIZATION_LEVELS
            ]
        return found
