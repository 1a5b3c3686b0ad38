"""OpenVINO on the CPU, reading the ONNX file (or OpenVINO IR) directly, its inference
precision pinned and read back; parallel streams run a batch's sub-batches side by side.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .base import Port, Runtime, RuntimeSettings, RuntimeUnavailable, Session, register

OV_PRECISIONS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
OV_CAPABILITIES = {"fp32": "FP32", "bf16": "BF16", "fp16": "FP16"}
OV_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
_core: Any = None


def _ov_core() -> Any:
    global _core
    if _core is None:
        import openvino as ov

        _core = ov.Core()
    return _core


class OpenVinoSession(Session):
    def __init__(
        self, compiled: Any, settings: RuntimeSettings, in_use: str, output_names: Sequence[str]
    ):
        import openvino as ov

        self.compiled, self.settings, self.in_use = compiled, settings, in_use
        self.request = compiled.create_infer_request()
        # An infer request (and the queue) serves one caller at a time; ONNX Runtime's run is
        # thread-safe, so callers may share a session between threads.
        self.lock = threading.Lock()
        # Inputs too under the model file's names: compiling folds a no-op Cast of CLIP's
        # pixel_values and the input port answers "/vision_model/embeddings/Cast_output_0".
        self.inputs = {_file_name(p): Port(_file_name(p), _ov_shape(p)) for p in compiled.inputs}
        # Outputs under the names the model file gives them, in its order, as ONNX Runtime
        # hands them back. Not the compiled ports' get_any_name(): compiling may fold the node
        # that made an output (an Add of an all-zero bias, an Identity) and merge its
        # producer's tensor name into the output's, and get_any_name() returns whichever name
        # sorts first (a Marian decoder's `logits` comes back as "/lm_head/MatMul_output_0").
        self.ports = {name: compiled.output(name) for name in output_names}
        self.outputs = {name: Port(name, _ov_shape(p)) for name, p in self.ports.items()}
        self.jobs = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self.queue = ov.AsyncInferQueue(compiled, self.jobs) if self.jobs > 1 else None

    def _ports(self, outputs):
        return [self.ports[n] for n in (outputs if outputs is not None else self.outputs)]

    def run(self, outputs, feeds):
        ports = self._ports(outputs)
        with self.lock:
            self.request.infer(dict(feeds))
            return [self.request.get_tensor(p).data.copy() for p in ports]

    def run_many(self, outputs, feeds):
        if self.queue is None or len(feeds) < 2:
            return super().run_many(outputs, feeds)
        ports = self._ports(outputs)
        results: list[Any] = [None] * len(feeds)

        def done(request: Any, index: int) -> None:
            results[index] = [request.get_tensor(p).data.copy() for p in ports]

        # Largest first: the streams take the next run as they free up, so the long rows that
        # sort last in a token-aware plan would otherwise leave the other streams idle at the end.
        order = sorted(range(len(feeds)), key=lambda i: -_size(feeds[i]))
        with self.lock:
            self.queue.set_callback(done)
            for i in order:
                self.queue.start_async(dict(feeds[i]), i)
            self.queue.wait_all()
        return results


def _size(feeds: Mapping[str, np.ndarray]) -> int:
    """The elements of a run's largest input: what its cost grows with."""
    return max((a.size for a in feeds.values()), default=0)


def _file_name(port: Any) -> str:
    """The name the model file gives an output, read off the model before it is compiled: an
    ONNX graph's output name is the port's only one. (A port with several, as an IR saved
    after transformations may have, is named by one not made up by torch's ONNX exporter,
    "/module/Op_output_0" or "onnx::Op_12", where it has one.)"""
    names = sorted(port.get_names())
    return min(names, key=lambda n: n.startswith("/") or n.startswith("onnx::"))


def _ov_shape(port: Any) -> tuple[Any, ...]:
    return tuple(d.get_length() if d.is_static else None for d in port.get_partial_shape())


@register
class OpenVino(Runtime):
    """OpenVINO on the CPU, reading the ONNX file (or OpenVINO IR, .xml) directly. The CPU plugin
    picks bf16 by itself where the CPU has it, so INFERENCE_PRECISION_HINT is always set and read
    back; `threads` 0 leaves INFERENCE_NUM_THREADS to OpenVINO (every core), `streams` 0 leaves
    NUM_STREAMS to the performance `hint`."""

    name = "openvino"
    devices = ("cpu",)
    precisions = ("fp32", "bf16", "fp16")
    # THROUGHPUT with streams left to OpenVINO: a dynamic batch is cut into several sub-batches
    # (token-aware batching), and one stream per core runs them side by side with one thread
    # each, where one stream of two threads waits at every layer for the slower thread and
    # leaves cores idle between small sub-batches (served on 2 cores: 1.12x the rate of LATENCY
    # with one stream; benchmarks/served_runtimes.py).
    options = {"threads": 0, "streams": 0, "hint": "THROUGHPUT"}
    choices = {"hint": OV_HINTS}

    @classmethod
    def offered(cls, device):
        core = _ov_core()
        if device.upper() not in core.available_devices:
            return {
                "precisions": [],
                "available": False,
                "why": f"OpenVINO sees no {device.upper()} (it sees "
                f"{', '.join(core.available_devices) or 'nothing'})",
            }
        caps = set(core.get_property(device.upper(), "OPTIMIZATION_CAPABILITIES"))
        found = [p for p in cls.precisions if OV_CAPABILITIES[p] in caps]
        return {
            "precisions": found,
            "available": True,
            "why": f"OPTIMIZATION_CAPABILITIES: {' '.join(sorted(caps))}",
        }

    @classmethod
    def config(cls, settings: RuntimeSettings) -> dict[str, str]:
        opts = settings.options
        config = {
            "INFERENCE_PRECISION_HINT": OV_PRECISIONS[settings.precision],
            "PERFORMANCE_HINT": opts["hint"],
        }
        if opts["streams"]:
            config["NUM_STREAMS"] = str(opts["streams"])
        if opts["threads"]:
            config["INFERENCE_NUM_THREADS"] = str(opts["threads"])
        return config

    @classmethod
    def open(cls, path, settings, shapes=None):
        cls.require_offered(settings)
        core = _ov_core()
        config = cls.config(settings)
        model = core.read_model(path)
        names = [_file_name(p) for p in model.outputs]  # before compiling renames any
        compiled = core.compile_model(model, settings.device.upper(), config)
        got = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
        if got != config["INFERENCE_PRECISION_HINT"]:
            raise RuntimeUnavailable(
                f"runtime {cls.name}: asked for {settings.precision}, the compiled model runs {got}"
            )
        return OpenVinoSession(
            compiled, settings, f"OpenVINO {settings.device.upper()} {got}", names
        )
