"""The spec's `quantization:` section: which quantized graph variants a release builds and gates
(hf2triton.runtimes.quantizers builds ONNX Runtime's, the OpenVINO plug-ins their own). It
imports nothing of the runtimes, so the variant context can name it without a cycle.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hf2triton.util.specbase import Strict


class QuantizationSpec(Strict):
    method: Literal["dynamic-int8", "int8-blockwise", "int4-blockwise", "none"] = Field(
        "dynamic-int8",
        description="dynamic-int8: ONNX Runtime's dynamic quantization (int8 "
        "weights, activation ranges per batch); int8-blockwise: MatMulNBits, int8 weights in "
        "blocks of `block_size` with their own scales; int4-blockwise: the same with 4-bit "
        "weights; none: fp32",
    )
    weight_type: Literal["qint8", "quint8"] = Field(
        "qint8", description="dynamic-int8: signed or unsigned int8 weights"
    )
    # Per-channel keeps the worst-case cosine at 0.989 on MiniLM where per-tensor drops to 0.954.
    per_channel: bool = Field(True, description="dynamic-int8: a scale per output channel")
    reduce_range: bool = Field(
        False, description="dynamic-int8: 7-bit weights (older CPUs without VNNI overflow less)"
    )
    op_types: list[str] | None = Field(
        None, description="ONNX op types to quantize; default: ONNX Runtime's own list"
    )
    block_size: Literal[16, 32, 64, 128, 256] = Field(
        32, description="int8-blockwise: weights per scale (smaller: closer to fp32)"
    )
    accuracy_level: Literal[0, 1, 2, 3, 4] = Field(
        4,
        description="int8-blockwise: what the MatMuls compute in (4: int8 activations, which "
        "CPUs with VNNI or AMX run fastest; 0: as the graph says, fp32)",
    )
    fuse: bool = Field(
        False,
        description="first fuse the graph's attention, LayerNorm and GELU into ONNX "
        "Runtime's own kernels (onnxruntime.transformers.optimizer, BERT-family encoders)",
    )
    search: bool = Field(
        False,
        description="also build and gate the variant grid (QInt8/QUInt8, per-tensor/channel, "
        "reduce_range, MatMul-only, int8-blockwise block sizes and accuracy levels, the fused "
        "graph alone and combined, ORT-optimised fp32) and ship the fastest that passes",
    )
    prune: bool = Field(
        True,
        description="with several candidates to time: time one of each runtime first (its "
        "first: the spec's own variant on ONNX Runtime), then build and time the others of the "
        "fastest runtime only, and judge those fastest first; another runtime's are built and "
        "timed only when their first ran faster than the fastest that passed so far (none of "
        "the fastest's passed, or the one that did is slower). false: build and time every "
        "candidate",
    )
    fallback_to_fp32: bool = Field(
        True,
        description="when the int8 model misses the gate, validate and ship the fp32 ONNX model",
    )
