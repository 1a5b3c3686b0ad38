"""The shared ONNX Runtime quantizers: dynamic int8 and block-wise (MatMulNBits) weight
quantization of the exported model as the spec's `quantization` section asks, ONNX Runtime's
attention fusion and graph optimisation of the fp32 graph, and the variant grid of
`quantization.search`. A seq2seq export (a directory of encoder, decoder and decoder-with-past
files) is quantized file by file; a file that does not survive quantization (ORT fails to
quantize it or to load the result) ships fp32, and the variant says so. The ONNX Runtime plug-in
(hf2triton.runtimes.onnxruntime) decides which of these a release builds.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from hf2triton.errors import QuantizationError, WorkerDiedError
from hf2triton.runtimes.base import ORT_ONLY, Variant, VariantId, build_variant
from hf2triton.runtimes.quantization import QuantizationSpec
from hf2triton.serving.seq2seq import ONNX_FILES
from hf2triton.util import quiet
from hf2triton.util.isolated import isolates, run_isolated
from hf2triton.util.runs import step_logger
from hf2triton.util.workspace import sha256_file

# ONNX Runtime asks for its quantization pre-processing (symbolic shape inference, then graph
# optimisation) on every call. Measured on all-MiniLM-L6-v2: symbolic shape inference fails on
# optimum's export ("Incomplete symbolic shape inference"), and with it skipped the pre-processed
# int8 model has the same accuracy (min cosine 0.9391 both) and speed within 2% (806 vs 793
# sentences/s at batch 32), so the step is not run and its reminder is dropped.
PRE_PROCESS_REMINDER = "Please consider to run pre-processing before quantization"


def _dynamic_int8(src: Path, target: Path, spec: QuantizationSpec) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    companions = _companions(src)
    apart, size = bool(companions), sum(p.stat().st_size for p in [src, *companions])
    if isolates(size):  # a large graph: in a child, reading each weight from its file
        run_isolated(
            "int8 quantization", size, dynamic_int8_lean, str(src), str(target), spec, apart
        )
        return
    with quiet.dropped("", PRE_PROCESS_REMINDER):
        quantize_dynamic(
            src,
            target,
            weight_type=QuantType.QInt8 if spec.weight_type == "qint8" else QuantType.QUInt8,
            per_channel=spec.per_channel,
            reduce_range=spec.reduce_range,
            op_types_to_quantize=spec.op_types,
            use_external_data_format=apart,
        )


def dynamic_int8_lean(src: str, target: str, spec: QuantizationSpec, apart: bool) -> None:
    """ONNX Runtime's dynamic int8 quantization as `quantize_dynamic` does it, for a process of
    its own (it changes the working directory and ONNX Runtime's shape-inference reload), holding
    the fp32 graph once, or not at all where its weights lie in a file beside it (`apart`).

    `quantize_dynamic` holds the graph three times over: loaded, deep-copied to run shape
    inference on disk, and reloaded (8.8 GB for multilingual-e5-large's 2.1 GB graph). Here shape
    inference runs on the graph without its large weights, the result written into the graph
    itself; and external weights are not loaded: ONNX reads an external tensor from the working
    directory when ONNX Runtime asks for its array, one weight at a time, and what was not
    quantized is loaded back before saving (4.1 GB for the same graph). The graph and data
    written are byte for byte `quantize_dynamic`'s (tests/runtimes/test_quantizers.py)."""
    import os

    import onnx
    from onnx.external_data_helper import load_external_data_for_model
    from onnxruntime.quantization import onnx_quantizer
    from onnxruntime.quantization.quant_utils import get_opset_version

    folder, out = Path(src).resolve().parent, Path(target).resolve()
    model = onnx.load(src, load_external_data=False)
    if get_opset_version(model) < 11:  # an upgrade would reload ORT's way: weights not loaded
        raise QuantizationError(
            f"{src} is at opset {get_opset_version(model)}: dynamic int8 of a large graph needs "
            "opset 11 or later; export it at export.opset 11 or later"
        )
    onnx_quantizer.save_and_reload_model_with_shape_infer = _with_shapes
    os.chdir(folder)
    quantizer = _ort_quantizer(model, spec)
    del model  # the quantizer holds the graph, once
    quantizer.quantize_model()
    load_external_data_for_model(quantizer.model.model, str(folder))  # the fp32 weights left
    os.chdir(out.parent)  # ONNX checks the data file's name from the working directory
    quantizer.model.save_model_to_file(str(out), apart)


def _ort_quantizer(model: Any, spec: QuantizationSpec) -> Any:
    """ONNX Runtime's dynamic int8 quantizer on `model`, set up as `quantize_dynamic` sets it."""
    from onnxruntime.quantization import QuantType, onnx_quantizer
    from onnxruntime.quantization.quant_utils import QuantizationMode, update_opset_version
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    qtype = QuantType.QInt8 if spec.weight_type == "qint8" else QuantType.QUInt8
    return onnx_quantizer.ONNXQuantizer(
        update_opset_version(_with_shapes(model), qtype),
        spec.per_channel,
        spec.reduce_range,
        QuantizationMode.IntegerOps,
        False,  # dynamic
        qtype,
        QuantType.QUInt8,  # dynamic activations are uint8
        None,
        None,
        None,
        spec.op_types or list(IntegerOpsRegistry.keys()),
        {"MatMulConstBOnly": True},
    )


def _with_shapes(model: Any) -> Any:
    """`model` as ONNX Runtime's quantizer has it after its shape-inference reload (a save with
    the weights apart, shape inference on disk, a load): the inferred shapes, subgraphs' too, and
    each weight ONNX would have saved apart marked as held in the graph, which the load leaves on
    it (and the saved graph keeps). Shapes are inferred on a copy without those weights."""
    import sys

    import onnx
    from onnxruntime.quantization.quant_utils import add_infer_metadata

    light = onnx.ModelProto()
    graph = model.graph
    for field, value in model.ListFields():
        if field.name != "graph":
            _copy_field(light, field, value)
    for field, value in graph.ListFields():
        if field.name != "initializer":
            _copy_field(light.graph, field, value)
    for t in graph.initializer:
        # onnx.save_model(save_as_external_data=True)'s own test: sys.getsizeof >= 1024.
        if t.HasField("raw_data") and sys.getsizeof(t.raw_data) >= 1024:
            t.data_location = onnx.TensorProto.DEFAULT
            stub = light.graph.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
            stub.data_location = onnx.TensorProto.EXTERNAL
            stub.external_data.add(key="location", value="weights-left-out")
        else:
            light.graph.initializer.add().CopyFrom(t)
    _copy_shapes(onnx.shape_inference.infer_shapes(light).graph, graph)
    add_infer_metadata(model)
    return model


def _copy_shapes(inferred: Any, graph: Any) -> None:
    """The inferred value_info of `inferred` into `graph`, and so on into their subgraphs (an
    If's branches, a Loop's body), which shape inference leaves node for node in place."""
    import onnx

    del graph.value_info[:]
    graph.value_info.extend(inferred.value_info)
    for node, done in zip(graph.node, inferred.node, strict=True):
        for attr, found in zip(node.attribute, done.attribute, strict=True):
            if attr.type == onnx.AttributeProto.GRAPH:
                _copy_shapes(found.g, attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub, sub_found in zip(attr.graphs, found.graphs, strict=True):
                    _copy_shapes(sub_found, sub)


def _copy_field(message: Any, field: Any, value: Any) -> None:
    if field.label == field.LABEL_REPEATED:
        getattr(message, field.name).extend(value)
    elif field.type == field.TYPE_MESSAGE:
        getattr(message, field.name).CopyFrom(value)
    else:
        setattr(message, field.name, value)


def _blockwise(bits: int, src: Path, target: Path, spec: QuantizationSpec) -> None:
    """MatMulNBits: weights of `bits` bits in blocks with their own scales. Int8 keeps accuracy
    where per-channel dynamic int8 does not (all-MiniLM-L6-v2: min cosine 0.997 against 0.94);
    int4 quarters a causal LM's weight reads, which every decode step makes once per token."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # It logs every MatMul it visits at INFO through its own logger: progress nobody reads.
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(src)),
        bits=bits,
        block_size=spec.block_size,
        is_symmetric=True,
        accuracy_level=spec.accuracy_level,
    )
    quantizer.process()
    quantizer.model.save_model_to_file(str(target), use_external_data_format=False)


def _copy(src: Path, target: Path, spec: QuantizationSpec) -> None:
    for p in [src, *_companions(src)]:
        shutil.copyfile(p, target.parent / p.name.replace(src.name, target.name, 1))


# quantization.method -> how one ONNX file becomes its quantized file.
METHODS: dict[str, Callable[[Path, Path, QuantizationSpec], None]] = {
    "dynamic-int8": _dynamic_int8,
    "int8-blockwise": partial(_blockwise, 8),
    "int4-blockwise": partial(_blockwise, 4),
    "none": _copy,
}


def method_name(spec: QuantizationSpec) -> str:
    """The variant's name in reports and MLflow, e.g. dynamic-int8/qint8/per-channel."""
    fused = "/fused" if spec.fuse else ""
    if spec.method == "none":
        return "fp32/fused" if spec.fuse else "none"
    if spec.method in ("int8-blockwise", "int4-blockwise"):
        return f"{spec.method}/b{spec.block_size}/acc{spec.accuracy_level}{fused}"
    return (
        f"dynamic-int8/{spec.weight_type}/"
        f"{'per-channel' if spec.per_channel else 'per-tensor'}"
        f"{'/reduce-range' if spec.reduce_range else ''}"
        f"{'/' + '+'.join(spec.op_types) if spec.op_types else ''}{fused}"
    )


def quantize_onnx(onnx_path: str, spec: QuantizationSpec, work_root: str) -> Variant:
    """The quantized model for `onnx_path` (fused first when `spec.fuse`); a QuantizationError
    naming the method when ONNX Runtime cannot quantize it."""
    src = Path(onnx_path)
    if src.is_dir():
        return _quantize_files(src, spec, work_root)
    source = Path(fuse_fp32(onnx_path, work_root)["onnx_path"]) if spec.fuse else src

    def build(out: Path) -> dict:
        try:
            METHODS[spec.method](source, out / "model.onnx", spec)
        except WorkerDiedError:  # killed (out of memory): the release stops, not a verdict
            raise
        except Exception as exc:  # ORT raises plain Exceptions for unsupported graphs
            raise QuantizationError(
                f"{spec.method} quantization of {source} failed: {exc}. Set quantization.method: "
                "none to ship fp32, or change quantization.op_types"
            ) from exc
        return {}

    return build_variant(
        work_root,
        "quantize",
        [sha256_file(source), spec.model_dump()],
        build,
        VariantId(method_name(spec), ORT_ONLY, src),
    )


def _companions(model: Path) -> list[Path]:
    """External-data files saved beside an ONNX file (`x.onnx_data`, `x.onnx.data`)."""
    return sorted(
        p
        for p in model.parent.iterdir()
        if p.name != model.name and p.name.startswith(model.name) and p.is_file()
    )


def _quantize_one(src: Path, target: Path, spec: QuantizationSpec) -> str | None:
    """Quantize one file; None when it survived, else why it did not (then nothing is left)."""
    import onnxruntime as ort

    try:
        METHODS[spec.method](src, target, spec)
        ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
        return None
    except WorkerDiedError:  # killed (out of memory): the release stops, no fp32 fallback kept
        raise
    except Exception as exc:  # ORT raises plain Exceptions for unsupported graphs
        for p in [target, *_companions(target)] if target.exists() else []:
            p.unlink(missing_ok=True)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def _quantize_files(src_dir: Path, spec: QuantizationSpec, work_root: str) -> Variant:
    names = list(ONNX_FILES.values())

    def build(out: Path) -> dict:
        fallbacks = {}
        for name in names:
            why = (
                "quantization.method is none"
                if spec.method == "none"
                else _quantize_one(src_dir / name, out / name, spec)
            )
            if why is not None:
                for p in [src_dir / name, *_companions(src_dir / name)]:
                    shutil.copyfile(p, out / p.name)
                if spec.method != "none":
                    fallbacks[name] = why
        return {"fallbacks": fallbacks}

    found = build_variant(
        work_root,
        "quantize",
        [[sha256_file(src_dir / n) for n in names], spec.model_dump()],
        build,
        VariantId(method_name(spec), ORT_ONLY, src_dir, main=""),
    )
    if found["fallbacks"]:
        log = step_logger()
        for name, why in found["fallbacks"].items():
            log.warning(
                "quantize: %s did not survive int8 quantization (%s); it ships fp32", name, why
            )
        found["method"] += f"/{len(found['fallbacks'])}-files-fp32"
    return found


def fuse_fp32(onnx_path: str, work_root: str) -> Variant:
    """The fp32 graph with attention, SkipLayerNorm, BiasGelu and the embeddings fused into ONNX
    Runtime's own kernels (onnxruntime.transformers.optimizer, BERT family). On all-MiniLM-L6-v2
    the outputs are unchanged (min cosine 0.9999999); whether it is faster depends on the CPU
    (the variant search times it)."""
    import onnxruntime as ort

    src = Path(onnx_path)

    def build(out: Path) -> dict:
        from onnxruntime.transformers.optimizer import optimize_model

        # num_heads/hidden_size 0: read from the graph.
        optimized = optimize_model(
            str(src), model_type="bert", num_heads=0, hidden_size=0, opt_level=1
        )
        fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
        optimized.save_model_to_file(str(out / "model.onnx"))
        return {"fused": fused}

    return build_variant(
        work_root,
        "optimize",
        [sha256_file(src), "fused", ort.__version__],
        build,
        VariantId("fp32/fused", ORT_ONLY, src),
    )


OPTIMIZATION_LEVELS = ("basic", "extended", "all")


def optimize_fp32(onnx_path: str, level: str, work_root: str) -> Variant:
    """The fp32 graph as ONNX Runtime optimises it at `level`, saved as a variant of its own."""
    import onnxruntime as ort

    src = Path(onnx_path)
    levels = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }

    def build(out: Path) -> dict:
        options = ort.SessionOptions()
        options.graph_optimization_level = levels[level]
        options.optimized_model_filepath = str(out / "model.onnx")
        ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
        return {}

    return build_variant(
        work_root,
        "optimize",
        [sha256_file(src), level, ort.__version__],
        build,
        VariantId(f"fp32/ort-{level}", ORT_ONLY, src),
    )


# What `quantization.search` tries besides the spec's own variant, measured on MiniLM: per-tensor
# drops the worst case to 0.954 where per-channel keeps 0.989; QUInt8 weights run at half speed.
SEARCH_GRID: list[dict[str, Any]] = [
    {"method": "dynamic-int8", "weight_type": "qint8", "per_channel": True},
    {"method": "dynamic-int8", "weight_type": "qint8", "per_channel": False},
    {"method": "dynamic-int8", "weight_type": "quint8", "per_channel": True},
    {"method": "dynamic-int8", "weight_type": "qint8", "per_channel": True, "reduce_range": True},
    {"method": "dynamic-int8", "weight_type": "qint8", "per_channel": True, "op_types": ["MatMul"]},
    # Block-wise int8 kept all-MiniLM-L6-v2 at min cosine 0.997 (block 32, int8 compute) where
    # dynamic int8 gave 0.94; it pays on CPUs with int8 dot products (VNNI, AMX).
    *(
        {"method": "int8-blockwise", "block_size": b, "accuracy_level": a, "fuse": f}
        for f in (False, True)
        for b in (32, 128)
        for a in (4, 0)
    ),
    # 4-bit weights: what a decoder's per-token weight reads shrink to (text generation).
    {"method": "int4-blockwise", "block_size": 32, "accuracy_level": 4},
    {"method": "none", "fuse": True},
]


def search_grid(spec: QuantizationSpec) -> list[QuantizationSpec]:
    """The search grid's variants of `spec`, each once, the spec's own left out."""
    seen = {method_name(spec)}
    found = []
    for change in SEARCH_GRID:
        variant = spec.model_copy(update=change)
        if method_name(variant) not in seen:
            seen.add(method_name(variant))
            found.append(variant)
    return found
