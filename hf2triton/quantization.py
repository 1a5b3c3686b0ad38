"""Quantization: ONNX Runtime dynamic int8 quantization of the exported model (or a plain copy of
the fp32 model when the spec says `method: none`). A seq2seq export (a directory of encoder,
decoder and decoder-with-past files) is quantized file by file; a file that does not survive
quantization (ORT fails to quantize it or to load the result) ships fp32, and the result says so.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, TypedDict

from hf2triton import quiet
from hf2triton.errors import QuantizationError
from hf2triton.spec import QuantizationSpec
from hf2triton.workspace import cached_step, digest, sha256_file, source_digest
from hf2triton.runs import step_logger
from hf2triton.serving.seq2seq import ONNX_FILES



# ONNX Runtime asks for its quantization pre-processing (symbolic shape inference, then graph
# optimisation) on every call. Measured on all-MiniLM-L6-v2: symbolic shape inference fails on
# optimum's export ("Incomplete symbolic shape inference"), and with it skipped the pre-processed
# int8 model has the same accuracy (min cosine 0.9391 both) and speed within 2% (806 vs 793
# sentences/s at batch 32), so the step is not run and its reminder is dropped.
PRE_PROCESS_REMINDER = "Please consider to run pre-processing before quantization"


class QuantizeResult(TypedDict):
    onnx_path: str  # a file, or for seq2seq the directory holding every role's file
    method: str
    fallbacks: dict[str, str]  # seq2seq: ONNX file kept in fp32 -> why
    fp32_bytes: int
    size_bytes: int
    sha256: str
    seconds: float
    reused: bool


def _dynamic_int8(src: Path, target: Path, spec: QuantizationSpec) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet.dropped("", PRE_PROCESS_REMINDER):
        quantize_dynamic(
            src, target,
            weight_type=QuantType.QInt8 if spec.weight_type == "qint8" else QuantType.QUInt8,
            per_channel=spec.per_channel, reduce_range=spec.reduce_range,
            op_types_to_quantize=spec.op_types,
            use_external_data_format=bool(_companions(src)),
        )


def _blockwise(bits: int, src: Path, target: Path, spec: QuantizationSpec) -> None:
    """MatMulNBits: weights of `bits` bits in blocks with their own scales. Int8 keeps accuracy
    where per-channel dynamic int8 does not (all-MiniLM-L6-v2: min cosine 0.997 against 0.94);
    int4 quarters a causal LM's weight reads, which every decode step makes once per token."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # It logs every MatMul it visits at INFO through its own logger: progress nobody reads.
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(onnx.load(str(src)), bits=bits, block_size=spec.block_size,
                                     is_symmetric=True, accuracy_level=spec.accuracy_level)
    quantizer.process()
    quantizer.model.save_model_to_file(str(target), use_external_data_format=False)


def _copy(src: Path, target: Path, spec: QuantizationSpec) -> None:
    for p in [src, *_companions(src)]:
        shutil.copyfile(p, target.parent / p.name.replace(src.name, target.name, 1))


# quantization.method -> how one ONNX file becomes its quantized file.
METHODS = {"dynamic-int8": _dynamic_int8, "int8-blockwise": partial(_blockwise, 8),
           "int4-blockwise": partial(_blockwise, 4), "none": _copy}


def quantize_onnx(onnx_path: str, spec: QuantizationSpec, work_root: str) -> QuantizeResult:
    """Write the quantized model for `onnx_path` (fused first when `spec.fuse`) and return
    where it is."""
    src = Path(onnx_path)
    if src.is_dir():
        return _quantize_files(src, spec, work_root)
    source = Path(fuse_fp32(onnx_path, work_root)["onnx_path"]) if spec.fuse else src
    key = digest([sha256_file(source), spec.model_dump(), source_digest(sys.modules[__name__])])
    started = time.perf_counter()

    def build(out: Path) -> dict:
        try:
            METHODS[spec.method](source, out / "model.onnx", spec)
        except Exception as exc:  # ORT raises plain Exceptions for unsupported graphs
            raise QuantizationError(
                f"{spec.method} quantization of {source} failed: {exc}. Set quantization.method: "
                "none to ship fp32, or change quantization.op_types"
            ) from exc
        return {}

    done = cached_step(work_root, "quantize", key, build)
    path = done.path / "model.onnx"
    return QuantizeResult(
        onnx_path=str(path),
        method=method_name(spec),
        fallbacks={},
        fp32_bytes=src.stat().st_size,
        size_bytes=path.stat().st_size,
        sha256=done.files["model.onnx"],
        seconds=round(time.perf_counter() - started, 3),
        reused=done.reused,
    )


def method_name(spec: QuantizationSpec) -> str:
    """The variant's name in reports and MLflow, e.g. dynamic-int8/qint8/per-channel."""
    fused = "/fused" if spec.fuse else ""
    if spec.method == "none":
        return "fp32/fused" if spec.fuse else "none"
    if spec.method in ("int8-blockwise", "int4-blockwise"):
        return f"{spec.method}/b{spec.block_size}/acc{spec.accuracy_level}{fused}"
    return (f"dynamic-int8/{spec.weight_type}/"
            f"{'per-channel' if spec.per_channel else 'per-tensor'}"
            f"{'/reduce-range' if spec.reduce_range else ''}"
            f"{'/' + '+'.join(spec.op_types) if spec.op_types else ''}{fused}")


def _companions(model: Path) -> list[Path]:
    """External-data files saved beside an ONNX file (`x.onnx_data`, `x.onnx.data`)."""
    return sorted(p for p in model.parent.iterdir()
                  if p.name != model.name and p.name.startswith(model.name) and p.is_file())


def _quantize_one(src: Path, target: Path, spec: QuantizationSpec) -> str | None:
    """Quantize one file; None when it survived, else why it did not (then nothing is left)."""
    import onnxruntime as ort

    try:
        METHODS[spec.method](src, target, spec)
        ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
        return None
    except Exception as exc:  # ORT raises plain Exceptions for unsupported graphs
        for p in [target, *_companions(target)] if target.exists() else []:
            p.unlink(missing_ok=True)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def _quantize_files(src_dir: Path, spec: QuantizationSpec, work_root: str) -> QuantizeResult:
    names = list(ONNX_FILES.values())
    key = digest([[sha256_file(src_dir / n) for n in names], spec.model_dump(),
                  source_digest(sys.modules[__name__])])
    started = time.perf_counter()

    def build(out: Path) -> dict:
        fallbacks = {}
        for name in names:
            why = "quantization.method is none" if spec.method == "none" else \
                _quantize_one(src_dir / name, out / name, spec)
            if why is not None:
                for p in [src_dir / name, *_companions(src_dir / name)]:
                    shutil.copyfile(p, out / p.name)
                if spec.method != "none":
                    fallbacks[name] = why
        return {"fallbacks": fallbacks}

    done = cached_step(work_root, "quantize", key, build)
    fallbacks = done.result["fallbacks"]
    if fallbacks:
        log = step_logger()
        for name, why in fallbacks.items():
            log.warning("quantize: %s did not survive int8 quantization (%s); it ships fp32",
                        name, why)
    size = lambda d: sum(p.stat().st_size for n in names
                         for p in [d / n, *_companions(d / n)])  # noqa: E731
    return QuantizeResult(
        onnx_path=str(done.path),
        method=method_name(spec) + (f"/{len(fallbacks)}-files-fp32" if fallbacks else ""),
        fallbacks=fallbacks,
        fp32_bytes=size(src_dir),
        size_bytes=size(done.path),
        sha256=digest(done.files),
        seconds=round(time.perf_counter() - started, 3),
        reused=done.reused,
    )


def fuse_fp32(onnx_path: str, work_root: str) -> QuantizeResult:
    """The fp32 graph with attention, SkipLayerNorm, BiasGelu and the embeddings fused into ONNX
    Runtime's own kernels (onnxruntime.transformers.optimizer, BERT family). On all-MiniLM-L6-v2
    the outputs are unchanged (min cosine 0.9999999); whether it is faster depends on the CPU
    (the variant search times it)."""
    import onnxruntime as ort

    src = Path(onnx_path)
    key = digest([sha256_file(src), "fused", ort.__version__,
                  source_digest(sys.modules[__name__])])
    started = time.perf_counter()

    def build(out: Path) -> dict:
        from onnxruntime.transformers.optimizer import optimize_model

        # num_heads/hidden_size 0: read from the graph.
        optimized = optimize_model(str(src), model_type="bert", num_heads=0, hidden_size=0,
                                   opt_level=1)
        fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
        optimized.save_model_to_file(str(out / "model.onnx"))
        return {"fused": fused}

    done = cached_step(work_root, "optimize", key, build)
    path = done.path / "model.onnx"
    return QuantizeResult(
        onnx_path=str(path), method="fp32/fused", fallbacks={}, fp32_bytes=src.stat().st_size,
        size_bytes=path.stat().st_size, sha256=done.files["model.onnx"],
        seconds=round(time.perf_counter() - started, 3), reused=done.reused)


# What `quantization.search` tries besides the spec's own variant, measured on MiniLM: per-tensor
# drops the worst case to 0.954 where per-channel keeps 0.989; QUInt8 weights run at half speed.
SEARCH_GRID: list[dict] = [
    {"method": "dynamic-int8", "weight_type": "qint8", "per_channel": True},
    {"method": "dynamic-int8", "weight_type": "qint8", "per_channel": False},
    {"method": "dynamic-int8", "weight_type": "quint8", "per_channel": True},
    {"method": "dynamic-int8", "weight_type": "qint8", "per_channel": True, "reduce_range": True},
    {"method": "dynamic-int8", "weight_type": "qint8", "per_channel": True,
     "op_types": ["MatMul"]},
    # Block-wise int8 kept all-MiniLM-L6-v2 at min cosine 0.997 (block 32, int8 compute) where
    # dynamic int8 gave 0.94; it pays on CPUs with int8 dot products (VNNI, AMX).
    *({"method": "int8-blockwise", "block_size": b, "accuracy_level": a, "fuse": f}
      for f in (False, True) for b in (32, 128) for a in (4, 0)),
    # 4-bit weights: what a decoder's per-token weight reads shrink to (text generation).
    {"method": "int4-blockwise", "block_size": 32, "accuracy_level": 4},
    {"method": "none", "fuse": True},
]
OPTIMIZATION_LEVELS = ("basic", "extended", "all")


def optimize_fp32(onnx_path: str, level: str, work_root: str) -> QuantizeResult:
    """The fp32 graph as ONNX Runtime optimises it at `level`, saved as a variant of its own."""
    import onnxruntime as ort

    src = Path(onnx_path)
    levels = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    key = digest([sha256_file(src), level, ort.__version__, source_digest(sys.modules[__name__])])
    started = time.perf_counter()

    def build(out: Path) -> dict:
        options = ort.SessionOptions()
        options.graph_optimization_level = levels[level]
        options.optimized_model_filepath = str(out / "model.onnx")
        ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
        return {}

    done = cached_step(work_root, "optimize", key, build)
    path = done.path / "model.onnx"
    return QuantizeResult(
        onnx_path=str(path), method=f"fp32/ort-{level}", fallbacks={},
        fp32_bytes=src.stat().st_size, size_bytes=path.stat().st_size,
        sha256=done.files["model.onnx"], seconds=round(time.perf_counter() - started, 3),
        reused=done.reused,
    )


# Kept in fp32 in the fp16 graph: what overflows or loses too much in half precision
# (LayerNorm's variance, Softmax's exponent, the decomposed LayerNorm's Pow and ReduceMean).
FP16_KEEP = ["LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
             "Softmax", "Pow", "ReduceMean"]


def fp16_graph(onnx_path: str, work_root: str) -> QuantizeResult:
    """The graph in fp16 for a GPU runtime, with fp32 inputs and outputs kept (the serving core
    feeds and reads fp32) and the overflow-prone ops in fp32 (onnxruntime.transformers.float16).
    On a CPU ONNX Runtime runs it through casts: the gate's CPU numerics check."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    src = Path(onnx_path)
    key = digest([sha256_file(src), FP16_KEEP, source_digest(sys.modules[__name__])])
    started = time.perf_counter()

    def build(out: Path) -> dict:
        model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True,
                                         op_block_list=FP16_KEEP)
        # The converter names the Cast it puts before each blocked consumer of a tensor after
        # the tensor alone: two consumers give two nodes of one name, which ONNX refuses.
        seen: dict[str, int] = {}
        for node in model.graph.node:
            count = seen[node.name] = seen.get(node.name, 0) + 1
            if node.name and count > 1:
                node.name = f"{node.name}_{count}"
        onnx.save(model, str(out / "model.onnx"))
        return {}

    done = cached_step(work_root, "fp16", key, build)
    path = done.path / "model.onnx"
    return QuantizeResult(
        onnx_path=str(path), method="fp16", fallbacks={}, fp32_bytes=src.stat().st_size,
        size_bytes=path.stat().st_size, sha256=done.files["model.onnx"],
        seconds=round(time.perf_counter() - started, 3), reused=done.reused,
    )


def after_activation(onnx_path: str) -> list[str]:
    """The MatMuls that read an activation's output (GELU, as one op or as erf and multiplies):
    the feed-forward blocks' second projection, whose inputs carry the outliers int8 loses most
    on (all-MiniLM-L6-v2: min cosine 0.963 with them in int8, 0.993 without, on its
    validation set)."""
    import onnx

    graph = onnx.load(onnx_path, load_external_data=False).graph
    made_by = {out: node for node in graph.node for out in node.output}

    def activated(name: str, depth: int = 4) -> bool:
        """Whether `name` is an activation's output: through at most `depth` multiplies and
        adds (GELU decomposed is x * 0.5 * (1 + erf(x / sqrt 2)))."""
        node = made_by.get(name)
        if node is None:
            return False
        if node.op_type in ("Gelu", "FastGelu", "BiasGelu", "Erf", "Tanh", "Relu"):
            return True
        return depth > 0 and node.op_type in ("Mul", "Add") and any(
            activated(i, depth - 1) for i in node.input)

    return [n.name for n in graph.node if n.op_type == "MatMul" and n.input
            and activated(n.input[0])]


def calibration_feeds(onnx_path: str, tokenizer_path: str, max_length: int,
                      texts: list[str], max_batch_tokens: int = 512) -> list[dict[str, Any]]:
    """The graph's inputs for `texts` as the serving core feeds them: tokenized with the served
    tokenizer, sorted by length into token-bounded sub-batches, padded within each."""
    from hf2triton.serving.text import OnnxText, plan_sub_batches

    text = OnnxText(onnx_path, tokenizer_path, max_length, max_batch_tokens=max_batch_tokens)
    encodings = text.encode(texts)
    lengths = [len(e.ids) for e in encodings]
    return [text.feeds([encodings[i] for i in group])
            for group in plan_sub_batches(lengths, max_batch_tokens)]


def openvino_int8(onnx_path: str, tokenizer_path: str, max_length: int, texts: list[str],
                  work_root: str) -> QuantizeResult:
    """NNCF post-training int8 of the graph as OpenVINO IR (model.xml + model.bin), calibrated
    on `texts` (the validation texts), the MatMuls after an activation kept in higher precision
    (`after_activation`). OpenVINO runs it; the gate decides whether it is accurate enough."""
    # Its telemetry is off: importing hf2triton made openvino_telemetry unimportable
    # (hf2triton.serving.openvino_telemetry_off), so NNCF uses its no-op stub.
    import nncf
    import openvino as ov

    src = Path(onnx_path)
    keep = after_activation(onnx_path)
    key = digest([sha256_file(src), sha256_file(tokenizer_path), max_length, texts, keep,
                  nncf.__version__, ov.__version__, source_digest(sys.modules[__name__])])
    started = time.perf_counter()

    def build(out: Path) -> dict:
        feeds = calibration_feeds(onnx_path, tokenizer_path, max_length, texts)
        model = ov.Core().read_model(str(src))
        # NNCF logs each node it leaves out at INFO and draws progress bars on stdout: noise in
        # a release's log (and stdout carries the release's one JSON line).
        nncf.set_log_level(logging.WARNING)
        with contextlib.redirect_stdout(io.StringIO()):
            quantized = nncf.quantize(
                model, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER,
                subset_size=len(feeds), ignored_scope=nncf.IgnoredScope(names=keep,
                                                                        validate=False))
        ov.save_model(quantized, str(out / "model.xml"), compress_to_fp16=False)
        return {}

    done = cached_step(work_root, "openvino-int8", key, build)
    path = done.path / "model.xml"
    return QuantizeResult(
        onnx_path=str(path), method="openvino-int8", fallbacks={},
        fp32_bytes=src.stat().st_size,
        size_bytes=path.stat().st_size + path.with_suffix(".bin").stat().st_size,
        sha256=done.files["model.xml"], seconds=round(time.perf_counter() - started, 3),
        reused=done.reused,
    )


def quantize_variants(onnx_path: str, spec: QuantizationSpec, work_root: str,
                      device: str = "cpu", openvino_calibration: tuple | None = None
                      ) -> list[QuantizeResult]:
    """The spec's own variant first; for a GPU the fp16 graph; for OpenVINO, given
    `openvino_calibration` (tokenizer.json, max_length, texts), its int8 graph; with
    `quantization.search`, every variant of the search grid and the ONNX Runtime-optimised fp32
    graphs after it (single-file models only)."""
    results = [quantize_onnx(onnx_path, spec, work_root)]
    if device == "gpu" and not Path(onnx_path).is_dir():
        results.append(fp16_graph(onnx_path, work_root))
    if openvino_calibration and spec.method != "none" and not Path(onnx_path).is_dir():
        results.append(openvino_int8(onnx_path, *openvino_calibration, work_root))
    if not spec.search or Path(onnx_path).is_dir():
        return results
    seen = {results[0]["method"]}
    for change in SEARCH_GRID:
        variant = spec.model_copy(update=change)
        if method_name(variant) not in seen:
            seen.add(method_name(variant))
            results.append(quantize_onnx(onnx_path, variant, work_root))
    results.extend(optimize_fp32(onnx_path, level, work_root) for level in OPTIMIZATION_LEVELS)
    return results

