"""ONNX Runtime's CPU provider, and the session every ONNX Runtime provider opens (the CUDA and
TensorRT runtimes are this one with another provider).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from .base import Port, Runtime, RuntimeSettings, RuntimeUnavailable, Session, register


class OrtSession(Session):
    def __init__(self, session: Any, settings: RuntimeSettings):
        self.session, self.settings = session, settings
        self.in_use = session.get_providers()[0]
        self.pad_to = int(settings.options.get("pad_to", 0))  # a runtime that buckets shapes
        self.inputs = {i.name: Port(i.name, tuple(i.shape)) for i in session.get_inputs()}
        self.outputs = {o.name: Port(o.name, tuple(o.shape)) for o in session.get_outputs()}

    def run(self, outputs, feeds):
        return self.session.run(list(outputs) if outputs is not None else None, dict(feeds))


@register
class OnnxRuntime(Runtime):
    """ONNX Runtime's CPU provider. The precision names the graph's float type (an fp16 graph
    with fp32 inputs and outputs runs through its Casts; int8-quantized graphs are fp32 ones)."""

    name = "onnxruntime"
    devices = ("cpu",)
    precisions: ClassVar[tuple[str, ...]] = ("fp32", "fp16")
    options = {"threads": 0}
    provider: ClassVar[str] = "CPUExecutionProvider"

    @classmethod
    def offered(cls, device):
        import onnxruntime as ort

        found = cls.provider in ort.get_available_providers()
        return {
            "precisions": list(cls.precisions) if found else [],
            "available": found,
            "why": ""
            if found
            else f"this onnxruntime build has no {cls.provider} "
            f"(it has {', '.join(ort.get_available_providers())})",
        }

    @classmethod
    def providers(cls, settings: RuntimeSettings, shapes: Any = None) -> list[Any]:
        return [cls.provider]

    @classmethod
    def open(cls, path, settings, shapes=None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if settings.options.get("threads"):
            options.intra_op_num_threads = int(settings.options["threads"])
        session = OrtSession(
            ort.InferenceSession(path, options, providers=cls.providers(settings, shapes)), settings
        )
        # ONNX Runtime falls back to the CPU with only a warning when a provider cannot start.
        if session.in_use != cls.provider:
            raise RuntimeUnavailable(
                f"runtime {cls.name}: {cls.provider} is not in use for {os.path.basename(path)} "
                f"(ONNX Runtime fell back to {session.in_use}; providers this onnxruntime has: "
                f"{', '.join(ort.get_available_providers())}): run it on a machine with a GPU "
                "and onnxruntime-gpu, or choose a CPU runtime"
            )
        cls.warm(session, shapes)
        return session

    @classmethod
    def warm(cls, session: OrtSession, shapes) -> None:
        """Nothing to build ahead on this provider."""
