"""Runtimes of the serving core: what opens a model file for a device and precision and runs feeds
(ONNX Runtime on CPU, CUDA or TensorRT; OpenVINO on CPU), registered by name in `RUNTIMES`, the one
table of runtimes: the pipeline's plug-in of each (hf2triton.runtimes, a module of the same name)
names its class here and is found from it.

serving.json's `runtime` names one with every setting that changes numerics, the precision always
pinned: `{"name": "openvino", "device": "cpu", "precision": "bf16", "threads": 0, "streams": 0,
"hint": "THROUGHPUT"}`. A serving.json without it (versions released before runtimes were plug-ins)
runs as they did: ONNX Runtime on CPU, fp32, `intra_op_threads` threads. Each runtime imports its
library when it opens a model, so a serving environment needs only the libraries it uses.

A new runtime is a module here named after it, registered where it is defined (`@register`), and
imported below, and its pipeline plug-in (hf2triton.runtimes fails to import without one). The
modules are imported in the table's order (runtime_info's and the error messages'), which is also
their sorted order.
"""

from __future__ import annotations

from .base import (
    DEFAULT_RUNTIME,
    PRECISION_ALIASES,
    RUNTIMES,
    Port,
    Runtime,
    RuntimeSettings,
    RuntimeUnavailable,
    Session,
    open_model,
    register,
    runtime_class,
    runtime_info,
    settings_of,
)
from .onnxruntime import OnnxRuntime, OrtSession
from .onnxruntime_cuda import OnnxRuntimeCuda
from .onnxruntime_tensorrt import OnnxRuntimeTensorrt
from .openvino import OV_CAPABILITIES, OV_HINTS, OV_PRECISIONS, OpenVino, OpenVinoSession
from .openvino_genai import GENAI_KV, GenAIModelFiles, OpenVinoGenAI

__all__ = [
    "DEFAULT_RUNTIME",
    "GENAI_KV",
    "OV_CAPABILITIES",
    "OV_HINTS",
    "OV_PRECISIONS",
    "PRECISION_ALIASES",
    "RUNTIMES",
    "GenAIModelFiles",
    "OnnxRuntime",
    "OnnxRuntimeCuda",
    "OnnxRuntimeTensorrt",
    "OpenVino",
    "OpenVinoGenAI",
    "OpenVinoSession",
    "OrtSession",
    "Port",
    "Runtime",
    "RuntimeSettings",
    "RuntimeUnavailable",
    "Session",
    "open_model",
    "register",
    "runtime_class",
    "runtime_info",
    "settings_of",
]
