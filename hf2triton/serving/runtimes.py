"""Runtimes of the serving core: what opens a model file for a device and precision and runs feeds
(ONNX Runtime on CPU, CUDA or TensorRT; OpenVINO on CPU), registered by name like kinds and targets.

serving.json's `runtime` names one with every setting that changes numerics, the precision always
pinned: `{"name": "openvino", "device": "cpu", "precision": "bf16", "threads": 0, "streams": 0,
"hint": "THROUGHPUT"}`. A serving.json without it (versions released before runtimes were plug-ins)
runs as they did: ONNX Runtime on CPU, fp32, `intra_op_threads` threads. Each runtime imports its
library when it opens a model, so a serving environment needs only the libraries it uses.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import numpy as np

# Other spellings of the precisions (OpenVINO's own are f32, f16, bf16).
PRECISION_ALIASES = {
    "f32": "fp32",
    "float32": "fp32",
    "f16": "fp16",
    "float16": "fp16",
    "bfloat16": "bf16",
}


# What a serving.json without a `runtime` runs (every version before runtimes were plug-ins), and
# the runtime a candidate without another one names.
DEFAULT_RUNTIME = {"name": "onnxruntime", "device": "cpu", "precision": "fp32"}


class RuntimeUnavailable(RuntimeError):
    """The runtime cannot run here as asked (no GPU, provider not in use, precision not offered
    by this device): retrying on the same machine will not help."""


class Port(NamedTuple):
    """An input or output of an opened model: its name and shape (an int per fixed dimension,
    None or a name per dynamic one); `len(shape)` is its rank."""

    name: str
    shape: tuple[Any, ...]


@dataclass(frozen=True)
class RuntimeSettings:
    """A runtime and its settings, validated on construction against the runtime's table entry.

    Example:
        >>> RuntimeSettings("openvino", "cpu", "f32", {"streams": 2}).to_dict()["precision"]
        'fp32'
    """

    name: str = "onnxruntime"
    device: str = "cpu"
    precision: str = "fp32"
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        runtime = runtime_class(self.name)
        device = str(self.device).lower()
        if device not in runtime.devices:
            raise ValueError(
                f"runtime {self.name}: device {self.device!r} is not one of "
                f"{', '.join(runtime.devices)}"
            )
        precision = PRECISION_ALIASES.get(str(self.precision).lower(), str(self.precision).lower())
        if precision not in runtime.precisions:
            raise ValueError(
                f"runtime {self.name}: precision {self.precision!r} is not offered "
                f"(it runs {', '.join(runtime.precisions)}): pin one of those"
            )
        unknown = sorted(set(self.options) - set(runtime.options))
        if unknown:
            raise ValueError(
                f"runtime {self.name} has no setting {', '.join(unknown)} (its "
                f"settings: {', '.join(runtime.options) or 'none'})"
            )
        options = {**runtime.options, **self.options}
        runtime.check(options)
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "precision", precision)
        object.__setattr__(self, "options", options)

    def to_dict(self) -> dict[str, Any]:
        """serving.json's `runtime`, every setting written out (defaults included)."""
        return {
            "name": self.name,
            "device": self.device,
            "precision": self.precision,
            **self.options,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RuntimeSettings:
        data = dict(data)
        if "name" not in data:
            raise ValueError(
                f'serving.json runtime {data} names no runtime: add "name", one '
                f"of {', '.join(RUNTIMES)}"
            )
        if "precision" not in data:
            raise ValueError(
                f"serving.json runtime {data['name']} names no precision: pin one "
                f"of {', '.join(runtime_class(data['name']).precisions)} (a runtime "
                "left to choose may pick a lower one by itself)"
            )
        name, precision = data.pop("name"), data.pop("precision")
        device = data.pop("device", runtime_class(name).devices[0])
        return cls(name, device, precision, data)


def settings_of(serving: Mapping[str, Any]) -> RuntimeSettings:
    """The runtime a serving.json asks for; without a `runtime` key ONNX Runtime on CPU, fp32,
    with the older `intra_op_threads` (what every version before runtimes ran)."""
    raw = serving.get("runtime")
    threads = int(serving.get("intra_op_threads", 0) or 0)
    if raw is None:
        d = DEFAULT_RUNTIME
        return RuntimeSettings(d["name"], d["device"], d["precision"], {"threads": threads})
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"serving.json runtime must be an object such as "
            f'{{"name": "onnxruntime", "precision": "fp32"}}, got {raw!r}'
        )
    runtime = RUNTIMES.get(raw.get("name", ""))
    if runtime is not None and "threads" in runtime.options and "threads" not in raw:
        raw = {**raw, "threads": threads}
    return RuntimeSettings.from_dict(raw)


class Session:
    """One opened model file. `inputs` and `outputs` are its ports in the file's order, `in_use`
    what actually runs it (checked when it was opened), `settings` what was asked for, and
    `max_rows` the most rows one run may have (None: any; engines built for a shape range)."""

    settings: RuntimeSettings
    inputs: dict[str, Port]
    outputs: dict[str, Port]
    in_use: str
    max_rows: int | None = None

    def run(
        self, outputs: Sequence[str] | None, feeds: Mapping[str, np.ndarray]
    ) -> list[np.ndarray]:
        """The named outputs (all, in the file's order, for None) of one run on `feeds`."""
        raise NotImplementedError

    def run_many(
        self, outputs: Sequence[str] | None, feeds: Sequence[Mapping[str, np.ndarray]]
    ) -> list[list[np.ndarray]]:
        """Several independent runs (sub-batches); a runtime with parallel streams overlaps
        them."""
        return [self.run(outputs, f) for f in feeds]


class Runtime:
    """One runtime (a table entry). Subclasses set the class attributes and implement `open`."""

    name: ClassVar[str]
    devices: ClassVar[tuple[str, ...]]
    precisions: ClassVar[tuple[str, ...]]  # what it can be asked for; `offered` says what runs
    options: ClassVar[dict[str, Any]] = {}  # its own settings and their defaults

    # How its settings are checked: whole numbers with their least value, true/false flags,
    # and settings that take one of a few values.
    at_least: ClassVar[dict[str, int]] = {"threads": 0, "streams": 0, "device_id": 0}
    flags: ClassVar[tuple[str, ...]] = ()
    choices: ClassVar[dict[str, tuple[str, ...]]] = {}

    @classmethod
    def check(cls, options: dict[str, Any]) -> None:
        """ValueError naming a bad setting value."""
        for key, least in cls.at_least.items():
            if key in options and (not isinstance(options[key], int) or options[key] < least):
                raise ValueError(
                    f"runtime {cls.name}: {key} must be a whole number >= {least}, "
                    f"got {options[key]!r}"
                )
        for key in cls.flags:
            if key in options and not isinstance(options[key], bool):
                raise ValueError(
                    f"runtime {cls.name}: {key} must be true or false, got {options[key]!r}"
                )
        for key, allowed in cls.choices.items():
            if key in options and options[key] not in allowed:
                raise ValueError(
                    f"runtime {cls.name}: {key} {options[key]!r} is not one of "
                    f"{', '.join(a or repr(a) for a in allowed)}"
                )

    @classmethod
    def offered(cls, device: str) -> dict[str, Any]:
        """{"precisions": what this machine's device runs, "available": bool, "why": str}."""
        raise NotImplementedError

    @classmethod
    def require_offered(cls, settings: RuntimeSettings) -> None:
        """RuntimeUnavailable naming what this device offers, unless it offers the precision."""
        offered = cls.offered(settings.device)
        if settings.precision not in offered["precisions"]:
            raise RuntimeUnavailable(
                f"runtime {cls.name}: this {settings.device.upper()} does not offer "
                f"{settings.precision} ({offered['why']}): choose one of "
                f"{', '.join(offered['precisions']) or 'none'}"
            )

    @classmethod
    def open(
        cls,
        path: str,
        settings: RuntimeSettings,
        shapes: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = None,
    ) -> Session:
        """Open `path` as `settings` say; RuntimeUnavailable when it cannot run so here.

        `shapes` ({input: (smallest, largest)}) is what the caller will feed; a runtime that
        builds engines for shape ranges (TensorRT) builds them now, before the model is ready."""
        raise NotImplementedError


RUNTIMES: dict[str, type[Runtime]] = {}


def register(cls: type[Runtime]) -> type[Runtime]:
    RUNTIMES[cls.name] = cls
    return cls


def runtime_class(name: str) -> type[Runtime]:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ValueError(f"runtime {name!r} is unknown: use one of {', '.join(RUNTIMES)}") from None


def open_model(
    path: str,
    settings: RuntimeSettings,
    shapes: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = None,
) -> Session:
    """`path` opened by the runtime `settings` name (see `Runtime.open`)."""
    return RUNTIMES[settings.name].open(path, settings, shapes)


def runtime_info() -> dict[str, dict[str, dict[str, Any]]]:
    """What every runtime offers on this machine, per device: {runtime: {device: {"precisions",
    "available", "why"}}} (a runtime whose library is missing is listed as unavailable)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, runtime in RUNTIMES.items():
        out[name] = {}
        for device in runtime.devices:
            try:
                out[name][device] = runtime.offered(device)
            except ImportError as exc:
                out[name][device] = {
                    "precisions": [],
                    "available": False,
                    "why": f"{exc.name or exc} is not installed",
                }
    return out


# --- ONNX Runtime -------------------------------------------------------------------------------


class OrtSession(Session):
    def __init__(self, session: Any, settings: RuntimeSettings):
        self.session, self.settings = session, settings
        self.in_use = session.get_providers()[0]
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
    precisions = ("fp32", "fp16")
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


@register
class OnnxRuntimeCuda(OnnxRuntime):
    """ONNX Runtime's CUDA provider (onnxruntime-gpu) on GPU `device_id`; fp32 or fp16 graphs."""

    name = "onnxruntime-cuda"
    devices = ("cuda",)
    precisions = ("fp32", "fp16")
    options = {"threads": 0, "device_id": 0}
    provider = "CUDAExecutionProvider"

    @classmethod
    def providers(cls, settings, shapes=None):
        return [
            (cls.provider, {"device_id": settings.options["device_id"]}),
            "CPUExecutionProvider",
        ]


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


# --- OpenVINO -----------------------------------------------------------------------------------

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
        self.inputs = {
            p.get_any_name(): Port(p.get_any_name(), _ov_shape(p)) for p in compiled.inputs
        }
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


# --- OpenVINO GenAI -----------------------------------------------------------------------------

GENAI_KV = ("", "f32", "bf16", "u8")  # "": the inference precision's own


@register
class OpenVinoGenAI(Runtime):
    """OpenVINO GenAI's ContinuousBatchingPipeline on the CPU, for text generation: a stateful
    OpenVINO IR (openvino_model.xml, exported by optimum-intel) whose paged KV cache stays inside
    the runtime between steps. Every setting that changes numerics is pinned: the inference
    precision, the KV cache's (`kv_cache`; "" is the inference precision's own, "u8" quantizes
    it) and no dynamic quantization of activations. `cache_gb` 0 lets the cache grow as
    sequences need it (a fixed size too small for what runs makes OpenVINO GenAI drop every
    running request). `split_prompts` false (the default) prefills a joining prompt whole in a
    step of its own, before decoding goes on (measured at 32 streams: time to first token p50
    64 ms against 87-95 ms when prompts are split over steps fused with decoding, tokens/s
    within 4%). The engine that drives it is hf2triton_serving/genai.py's."""

    name = "openvino-genai"
    devices = ("cpu",)
    precisions = ("fp32", "bf16")
    options = {"threads": 0, "kv_cache": "", "cache_gb": 0, "split_prompts": False}
    at_least = {**Runtime.at_least, "cache_gb": 0}
    flags = ("split_prompts",)
    choices = {"kv_cache": GENAI_KV}

    @classmethod
    def offered(cls, device):
        import openvino_genai  # noqa: F401 - not installed: not offered

        found = OpenVino.offered(device)
        return {**found, "precisions": [p for p in found["precisions"] if p in cls.precisions]}

    @classmethod
    def properties(cls, settings: RuntimeSettings) -> dict[str, str]:
        """The pipeline's properties: precisions pinned, never the library's defaults."""
        precision = OV_PRECISIONS[settings.precision]
        kv = settings.options["kv_cache"] or precision
        if precision == "bf16" and kv == "f32":
            raise RuntimeUnavailable(
                f"runtime {cls.name}: bf16 inference needs a bf16 or u8 "
                "KV cache, not f32: set kv_cache to bf16 or u8"
            )
        props = {
            "INFERENCE_PRECISION_HINT": precision,
            "KV_CACHE_PRECISION": kv,
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
        }
        if settings.options["threads"]:
            props["INFERENCE_NUM_THREADS"] = str(settings.options["threads"])
        return props

    @classmethod
    def open(cls, path, settings, shapes=None):
        cls.require_offered(settings)
        if os.path.basename(path) != "openvino_model.xml":
            raise RuntimeUnavailable(
                f"runtime {cls.name} serves a stateful OpenVINO IR "
                f"(openvino_model.xml), not {os.path.basename(path)}"
            )
        return GenAIModelFiles(os.path.dirname(path) or ".", settings, cls.properties(settings))


@dataclass(frozen=True)
class GenAIModelFiles:
    """An OpenVINO GenAI model as the runtime opened it: its directory and pinned properties.
    The engine (hf2triton_serving/genai.py) builds the pipeline with the batching it serves."""

    directory: str
    settings: RuntimeSettings
    properties: dict[str, str]

    @property
    def in_use(self) -> str:
        return (
            f"OpenVINO GenAI CPU {self.properties['INFERENCE_PRECISION_HINT']} "
            f"(KV cache {self.properties['KV_CACHE_PRECISION']})"
        )
