"""ONNX Runtime's CUDA provider on NVIDIA GPUs: fp32, and the fp16 graphs this module builds
(fused by ONNX Runtime's transformer optimizer, and plain; the TensorRT plug-in reads the plain
one). It serves deploy.device gpu; with `deploy.gpu_gate: cpu-numerics` the gate checks its
graphs on ONNX Runtime's CPU provider at the same precision (hf2triton.runtimes.devices)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from hf2triton.runtimes.base import (
    FP16,
    FP16_ORT,
    PLAIN,
    PLUGINS,
    Recipe,
    RuntimePlugin,
    Variant,
    VariantContext,
    VariantId,
    build_variant,
)
from hf2triton.serving import runtimes as serving_runtimes
from hf2triton.util.workspace import sha256_file


@PLUGINS.register
class OnnxRuntimeCuda(RuntimePlugin):
    serving: ClassVar[type[serving_runtimes.Runtime]] = serving_runtimes.OnnxRuntimeCuda
    device = "gpu"
    # fp16 first: with the gate on the CPU (gpu_gate cpu-numerics) the first that passes ships,
    # and on an H100 the fused fp16 graph computed 2.4x what plain fp32 did.
    auto: ClassVar[tuple[str, ...]] = ("fp16", "fp32")
    reads = {"fp32": frozenset({PLAIN}), "fp16": frozenset({FP16_ORT, FP16})}

    @classmethod
    def recipes(cls, ctx: VariantContext) -> list[Recipe]:
        if not ctx.single_file:
            return []
        return [
            Recipe(
                "fp16/fused",
                FP16_ORT,
                lambda: fused_fp16_graph(ctx.onnx_path, ctx.model_dir, ctx.work),
            ),
            Recipe("fp16", FP16, lambda: fp16_graph(ctx.onnx_path, ctx.work)),
        ]


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


def _unique_node_names(model: Any) -> None:
    """The fp16 converter names the Cast it puts before each blocked consumer of a tensor after
    the tensor alone: two consumers give two nodes of one name, which ONNX refuses."""
    seen: dict[str, int] = {}
    for node in model.graph.node:
        count = seen[node.name] = seen.get(node.name, 0) + 1
        if node.name and count > 1:
            node.name = f"{node.name}_{count}"


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
        _unique_node_names(model)
        onnx.save(model, str(out / "model.onnx"))
        return {}

    return build_variant(
        work_root, "fp16", [sha256_file(src), FP16_KEEP], build, VariantId("fp16", FP16, src)
    )


# config.json model_type -> the transformer optimizer's model type whose fusions fit its graph
# (encoders of the BERT family: embeddings, token and sequence classifiers, cross-encoders).
OPTIMIZER_TYPES = {
    t: "bert"
    for t in ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "mpnet")
}
# Other spellings of the two numbers the fusions need, per config.json.
HEADS_KEYS = ("num_attention_heads", "n_heads", "num_heads")
HIDDEN_KEYS = ("hidden_size", "dim", "d_model")


def fusion_shape(model_dir: str) -> tuple[str, int, int]:
    """(optimizer model type, attention heads, hidden size) from the model's config.json;
    ValueError saying why the optimizer cannot fuse this architecture."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path} for the attention shape: {exc}") from None
    model_type = str(config.get("model_type", ""))
    if model_type not in OPTIMIZER_TYPES:
        raise ValueError(
            f"ONNX Runtime's transformer optimizer has no fusions for model_type "
            f"{model_type!r} here (it fuses {', '.join(sorted(OPTIMIZER_TYPES))})"
        )
    heads = next((config[k] for k in HEADS_KEYS if isinstance(config.get(k), int)), 0)
    hidden = next((config[k] for k in HIDDEN_KEYS if isinstance(config.get(k), int)), 0)
    if not heads or not hidden or hidden % heads:
        raise ValueError(
            f"{path} gives no usable attention shape (heads {heads or 'missing'}, hidden size "
            f"{hidden or 'missing'})"
        )
    return OPTIMIZER_TYPES[model_type], heads, hidden


def fused_fp16_graph(onnx_path: str, model_dir: str, work_root: str) -> Variant:
    """The graph with attention, LayerNorm (with its residual Add), GELU and the embeddings
    fused into ONNX Runtime's own kernels (onnxruntime.transformers.optimizer, for the GPU),
    then in fp16 with fp32 inputs and outputs kept. The fused kernels keep what overflows in
    fp32 themselves (LayerNorm's statistics, Softmax). On an H100 (MiniLM, batches of 64) it
    computed 60,892 texts/s against 25,122 for the plain fp32 graph and 30,181 for the plain
    fp16 one, with no Memcpy node added. An architecture the optimizer cannot fuse raises, and
    the gate refuses the variant with why."""
    import onnxruntime as ort

    src = Path(onnx_path)
    model_type, heads, hidden = fusion_shape(model_dir)

    def build(out: Path) -> dict:
        from onnxruntime.transformers.optimizer import optimize_model

        # opt_level 0: the Python fusions alone, the same graph on any host (level 1 would run
        # ONNX Runtime's own pass first, on the CUDA provider where there is one, else not).
        optimized = optimize_model(
            str(src),
            model_type=model_type,
            num_heads=heads,
            hidden_size=hidden,
            opt_level=0,
            use_gpu=True,
        )
        fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
        if not any("Attention" in k for k in fused):
            raise ValueError(
                f"ONNX Runtime's transformer optimizer fused no attention in {src.name} "
                f"(model_type {model_type}, {heads} heads, hidden size {hidden}; fused: "
                f"{fused or 'nothing'})"
            )
        optimized.convert_float_to_float16(keep_io_types=True)
        _unique_node_names(optimized.model)
        optimized.save_model_to_file(str(out / "model.onnx"))
        return {"fused": fused}

    return build_variant(
        work_root,
        "fp16-fused",
        [sha256_file(src), model_type, heads, hidden, ort.__version__],
        build,
        VariantId("fp16/fused", FP16_ORT, src),
    )
