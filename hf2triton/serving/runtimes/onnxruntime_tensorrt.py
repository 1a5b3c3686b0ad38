"""ONNX Runtime's TensorRT provider in fp16, its engines built for the caller's shape range when
the model is opened and cached on disk.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from .base import Runtime, RuntimeSettings, RuntimeUnavailable, register
from .onnxruntime import OnnxRuntime


@register
class OnnxRuntimeTensorrt(OnnxRuntime):
    """ONNX Runtime's TensorRT provider in fp16, engines cached in `cache_dir` (writable; tied to
    the GPU model, driver and TensorRT version) and built when the model is opened, for the shape
    range the caller will feed (up to `max_rows` rows), so the version is ready only once built."""

    name = "onnxruntime-tensorrt"
    devices = ("cuda",)
    precisions = ("fp16",)
    options = {"threads": 0, "device_id": 0, "cache_dir": "", "max_rows": 64}
    at_least = {**Runtime.at_least, "max_rows": 1}
    provider = "TensorrtExecutionProvider"

    @classmethod
    def cache_dir(cls, settings: RuntimeSettings) -> str:
        path = settings.options["cache_dir"] or os.path.join(
            tempfile.gettempdir(), "hf2triton-trt-engines"
        )
        try:
            os.makedirs(path, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path):
                pass
        except OSError as exc:
            raise RuntimeUnavailable(
                f"runtime {cls.name}: the engine cache {path} is not "
                f"writable ({exc.strerror}): set cache_dir to a writable "
                "directory"
            ) from None
        return path

    @classmethod
    def profile(cls, settings, shapes) -> dict[str, str]:
        """TensorRT's optimisation profile (smallest, largest, and largest as the tuned shape)."""
        if not shapes:
            return {}

        def text(index: int) -> str:
            return ",".join(
                f"{name}:{'x'.join(str(d) for d in pair[index])}" for name, pair in shapes.items()
            )

        return {
            "trt_profile_min_shapes": text(0),
            "trt_profile_max_shapes": text(1),
            "trt_profile_opt_shapes": text(1),
        }

    @classmethod
    def providers(cls, settings, shapes=None):
        cache = cls.cache_dir(settings)
        trt = {
            "device_id": settings.options["device_id"],
            "trt_fp16_enable": True,
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": cache,
            "trt_timing_cache_enable": True,
            "trt_timing_cache_path": cache,
            **cls.profile(settings, shapes),
        }
        return [
            (cls.provider, trt),
            ("CUDAExecutionProvider", {"device_id": settings.options["device_id"]}),
            "CPUExecutionProvider",
        ]

    @classmethod
    def engine_shapes(cls, path: str, settings: RuntimeSettings, shapes: Any) -> dict:
        """The shape range of each of the graph's own inputs, rows capped at `max_rows`."""
        if not shapes:
            return {}
        import onnxruntime as ort

        # A profile naming an input the graph lacks is an error: read them off a bare session.
        bare = ort.SessionOptions()
        bare.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        names = {
            i.name
            for i in ort.InferenceSession(
                path, bare, providers=["CPUExecutionProvider"]
            ).get_inputs()
        }
        rows = settings.options["max_rows"]
        return {
            n: (tuple(lo), (min(hi[0], rows), *hi[1:]))
            for n, (lo, hi) in shapes.items()
            if n in names
        }

    @classmethod
    def open(cls, path, settings, shapes=None):
        session = super().open(path, settings, cls.engine_shapes(path, settings, shapes))
        session.max_rows = settings.options["max_rows"]
        return session

    @classmethod
    def warm(cls, session, shapes):
        # The engine is built on the first run of each profile: build it before serving.
        for index in (0, 1) if shapes else ():
            session.run(
                None, {n: np.ones(pair[index], dtype=np.int64) for n, pair in shapes.items()}
            )
