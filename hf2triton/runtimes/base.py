"""What a runtime plug-in declares, the table that finds it, and the graph variants the plug-ins
build.

A runtime plug-in is the pipeline's side of one runtime of the serving core: it names the serving
class it drives (`serving`, an entry of hf2triton.serving.runtimes.RUNTIMES, the one table of
runtimes, whose name it takes) and says the deploy device it serves, the precisions
`runtime.candidates: auto` tries on it, which graph formats it reads at which precision, the
graph variants it builds for itself (with their calibration) and its label. The serving core
opens and runs the model; the plug-in decides what the release tries. `PLUGINS` finds a
runtime's plug-in from its serving class.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, TypeVar

from hf2triton.serving import runtimes as serving_runtimes
from hf2triton.serving.runtimes import DEFAULT_RUNTIME, Runtime, RuntimeSettings, runtime_class
from hf2triton.util.workspace import cached_step, digest, source_digest

if TYPE_CHECKING:
    from hf2triton.kinds.base import ModelKind
    from hf2triton.runtimes.quantization import QuantizationSpec

# Graph formats: what a variant's files are, so a runtime can say whether it reads them.
PLAIN = "onnx"  # the export as it is: a float ONNX graph every ONNX-reading runtime runs
ORT_ONLY = "onnx-ort"  # ONNX Runtime's own operators or quantization (int8, MatMulNBits, fused)
FP16 = "onnx-fp16"  # half-precision ONNX with fp32 inputs and outputs
# The same with ONNX Runtime's fused operators (Attention, SkipLayerNormalization, ...)
FP16_ORT = "onnx-fp16-ort"
OPENVINO_IR = "openvino-ir"  # OpenVINO IR: model.xml and model.bin
STATEFUL_IR = "openvino-stateful-ir"  # a decoder's OpenVINO IR with its KV cache as state
# Whisper as OpenVINO GenAI's WhisperPipeline reads it: encoder IR, stateful decoder IR, the
# tokenizer and detokenizer IRs and the model's configs, in one directory
WHISPER_IR = "openvino-whisper-ir"
# Why the ONNX-reading CPU runtimes leave generators to OpenVINO GenAI under `auto` (its
# continuous batching over a paged KV cache; their generation loop is the serving core's own):
# SmolLM2-135M's shape at 32 streams on a 2-core AVX2 EPYC (docs/data/
# generation-release-idle-20261127.json), each the first candidate the pruned search timed.
GENERATORS_TO_GENAI = (
    "openvino-genai",
    "OpenVINO GenAI serves generators here (SmolLM2-135M's shape at 32 streams: 145.7 "
    "tokens/s at fp32 against ONNX Runtime's int8 86.2 and OpenVINO's fp32 59.9 on the ONNX "
    "export); list it in runtime.candidates to try it",
)
# Formats a runtime's recipe makes from the source model itself, not from the ONNX export: a
# release whose runtimes read only these exports no ONNX graph.
FROM_SOURCE = frozenset({STATEFUL_IR, WHISPER_IR})


class Variant(TypedDict, total=False):
    """One graph variant the gate may try: built, or refused with why (`error`)."""

    onnx_path: str  # the graph: a file, or (seq2seq) a directory of files
    method: str  # its name in reports and MLflow: "dynamic-int8/qint8/per-channel", "fp16"
    graph: str  # its format (PLAIN, ORT_ONLY, FP16, OPENVINO_IR, ...): who reads it
    fallbacks: dict[str, str]  # seq2seq: ONNX file kept in fp32 -> why
    fp32_bytes: int
    size_bytes: int
    sha256: str
    seconds: float
    reused: bool
    error: str  # set when building it failed: the gate refuses it with this reason
    planned: bool  # not built yet: the gate builds it when it first needs it (no onnx_path)


@dataclass(frozen=True)
class Recipe:
    """How one graph variant is made: its name and format known before it is built, so a build
    that raises still leaves a variant the gate refuses by name."""

    method: str
    graph: str
    build: Callable[[], Variant]

    def make(self) -> Variant:
        try:
            return self.build()
        except Exception as exc:  # noqa: BLE001 - one variant that breaks ends no release
            return failed_variant(self.method, self.graph, exc)

    def planned(self) -> Variant:
        """The variant before it is built: its name and format, no files yet."""
        return unbuilt_variant(self.method, self.graph)


@dataclass(frozen=True)
class VariantContext:
    """What a plug-in's variant builders may use: the export, the model it came from, the spec's
    quantization section and the kind's calibration items."""

    onnx_path: str  # the fp32 export: a file, or (seq2seq) a directory
    export_dir: str
    model_dir: str  # the fetched Hugging Face directory
    kind: ModelKind
    quantization: QuantizationSpec
    calibration: list[Any] | None  # the kind's calibration items; None: not calibrated
    max_length: int | None
    work: str

    @property
    def single_file(self) -> bool:
        return not Path(self.onnx_path).is_dir()


def export_variant(ctx: VariantContext, reused: bool = True) -> Variant:
    """The export itself, as the plain variant `fp32` (no copy)."""
    path = Path(ctx.onnx_path)
    size = _size(path)
    return Variant(
        onnx_path=str(path),
        method="fp32",
        graph=PLAIN,
        fallbacks={},
        fp32_bytes=size,
        size_bytes=size,
        sha256="",
        seconds=0.0,
        reused=reused,
    )


@dataclass(frozen=True)
class VariantId:
    """What a variant is, known before it is built: its name in reports and MLflow (`method`),
    its graph format, the graph it is made from (`source`: its size is the variant's
    `fp32_bytes`) and the file of the built folder that is its graph (`main`, with files of the
    same stem: external data, OpenVINO's .bin; "" for the whole folder, seq2seq); `others`, the
    graphs read beside it (Whisper's decoder IR beside its encoder's), counted in its size and
    its hash."""

    method: str
    graph: str
    source: Path
    main: str = "model.onnx"
    others: tuple[str, ...] = ()


def build_variant(
    work: str, step: str, inputs: list[Any], build: Callable[[Path], dict], made: VariantId
) -> Variant:
    """The variant `made`, built once by `build(out_dir)` (a cached step of `work`, keyed by
    `inputs` and the building module's source)."""
    started = time.perf_counter()
    key = digest([inputs, source_digest(sys.modules[build.__module__])])
    done = cached_step(work, step, key, build)
    main = made.main
    path = done.path / main if main else done.path
    graphs = [main, *made.others]
    if main:
        stems = {Path(g).stem for g in graphs}
        size = sum(_size(done.path / g) for g in graphs) + sum(
            p.stat().st_size
            for p in path.parent.iterdir()
            if p.name not in graphs and p.name.split(".")[0] in stems
        )
        read = {n: h for n, h in sorted(done.files.items()) if n.split(".")[0] in stems}
        sha = done.files[main] if not made.others else digest(read)
    else:
        size, sha = _size(path), digest(done.files)
    return Variant(
        onnx_path=str(path),
        method=made.method,
        graph=made.graph,
        fallbacks=done.result.get("fallbacks", {}),
        fp32_bytes=_size(made.source),
        size_bytes=size,
        sha256=sha,
        seconds=round(time.perf_counter() - started, 3),
        reused=done.reused,
    )


def _size(path: Path) -> int:
    """Bytes of a graph file, or of the ONNX files of a directory (seq2seq)."""
    return (
        sum(p.stat().st_size for p in path.iterdir() if ".onnx" in p.name)
        if path.is_dir()
        else path.stat().st_size
    )


def unbuilt_variant(method: str, graph: str, error: str = "") -> Variant:
    """A variant with no files: planned (built by the gate when needed), or failed (`error`)."""
    v = Variant(
        onnx_path="",
        method=method,
        graph=graph,
        fallbacks={},
        fp32_bytes=0,
        size_bytes=0,
        sha256="",
        seconds=0.0,
        reused=False,
    )
    if error:
        v["error"] = error
    else:
        v["planned"] = True
    return v


def failed_variant(method: str, graph: str, exc: BaseException) -> Variant:
    """A variant whose build raised: kept, with why, so the gate refuses it by name."""
    first = str(exc).splitlines()[0][:300] if str(exc) else ""
    return unbuilt_variant(
        method, graph, error=f"building it failed: {type(exc).__name__}: {first}"
    )


class RuntimePlugin:
    """One runtime as the pipeline sees it. Subclasses name the serving core's class they drive
    (`serving`), set the other class attributes (and override `recipes` when they build graphs
    of their own) and register where they are defined (`@PLUGINS.register`)."""

    serving: ClassVar[type[Runtime]]  # the serving core's runtime: OnnxRuntime, OpenVino, ...
    name: ClassVar[str]  # its name ("onnxruntime", "openvino", ...): read from `serving`
    device: ClassVar[str]  # the deploy device it serves: "cpu" or "gpu"
    # What `runtime.candidates: auto` tries, in order: precisions, or (precision, options)
    # pairs (empty: only when listed).
    auto: ClassVar[tuple[str | tuple[str, dict[str, Any]], ...]] = ()
    # What `auto` also tries under `runtime.objective: latency` (one request alone), after those.
    latency: ClassVar[tuple[str | tuple[str, dict[str, Any]], ...]] = ()
    # Graph formats it reads, per precision.
    reads: ClassVar[dict[str, frozenset[str]]] = {}
    # The model kinds it serves (None: every kind).
    kinds: ClassVar[frozenset[str] | None] = None
    # Kinds that `auto` leaves to another runtime where that one is offered here: kind name ->
    # (the other runtime's name, why), the why measured.
    yields_to: ClassVar[dict[str, tuple[str, str]]] = {}
    # The variants (methods) it reads whose weights are the export's f32 ones, uncompressed (a
    # graph-optimized copy too): at one stream, where a token reads every weight, the slowest.
    plain_weights: ClassVar[frozenset[str]] = frozenset({"fp32"})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "serving" in cls.__dict__:
            cls.name = cls.serving.name  # the serving table's name, written once, there

    @classmethod
    def serving_device(cls) -> str:
        """The serving core's device name ("cpu", "cuda")."""
        return cls.serving.devices[0]

    @classmethod
    def serves(cls, kind: ModelKind) -> bool:
        return cls.kinds is None or kind.name in cls.kinds

    @classmethod
    def refuses(cls, kind: ModelKind, model_dir: str) -> str:
        """Why it cannot serve the model in `model_dir` faithfully ("" when it can): asked of a
        runtime others yield to, which they then do not."""
        return ""

    @classmethod
    def runs(
        cls, variant: Variant, precision: str, options: Mapping[str, Any] | None = None
    ) -> bool:
        """Whether it runs `variant` at `precision` (with `options`, the runtime's settings)."""
        return variant["graph"] in cls.reads.get(precision, frozenset())

    @classmethod
    def settings(cls, precision: str, options: dict[str, Any]) -> RuntimeSettings:
        return RuntimeSettings(cls.name, cls.serving_device(), precision, options)

    @classmethod
    def recipes(cls, ctx: VariantContext) -> list[Recipe]:
        """The graph variants it builds for itself (none: it runs what others build)."""
        return []

    @staticmethod
    def computes(runtime: Mapping[str, Any]) -> str:
        """How it computes under these settings, beyond the weights it reads: its precision
        ("bf16"), and for a runtime with settings that approximate further, those too (the
        search's families, the gate's rule-outs of weights)."""
        return str(runtime.get("precision", "fp32"))

    @staticmethod
    def label(runtime: dict[str, Any]) -> str:
        """The one label of a runtime in names, logs and reports: 'openvino bf16'."""
        return f"{runtime['name']} {runtime['precision']}"


P = TypeVar("P", bound=type[RuntimePlugin])


class Plugins:
    """The pipeline's plug-in of each runtime of the serving core's table
    (hf2triton.serving.runtimes.RUNTIMES): a runtime is looked up by name there, and its plug-in
    found from its serving class. Every serving runtime has exactly one plug-in: a plug-in whose
    class is not in the table, or a second one for a class, is refused when it registers, and
    hf2triton.runtimes checks, once its plug-ins are imported, that none is missing.

    Example:
        >>> PLUGINS.load("openvino").serving is serving_runtimes.OpenVino
        True
    """

    def __init__(self) -> None:
        self._of: dict[type[Runtime], type[RuntimePlugin]] = {}

    def register(self, cls: P) -> P:
        """Register `cls` for its serving class (a decorator)."""
        served = cls.serving
        if serving_runtimes.RUNTIMES.get(served.name) is not served:
            raise TypeError(
                f"{cls.__name__} drives {served.__name__}, which is not in the serving core's "
                "table (hf2triton.serving.runtimes): register it there first"
            )
        if self._of.get(served, cls) is not cls:
            raise TypeError(
                f"two plug-ins drive runtime {served.name!r}: {self._of[served].__name__} and "
                f"{cls.__name__}"
            )
        self._of[served] = cls
        return cls

    def load(self, name: str) -> type[RuntimePlugin]:
        """The plug-in of the runtime `name` (ValueError naming the runtimes, for an unknown
        one)."""
        return self._of[runtime_class(name)]

    def values(self) -> list[type[RuntimePlugin]]:
        """Every plug-in, in the serving table's order."""
        return [self._of[c] for c in serving_runtimes.RUNTIMES.values() if c in self._of]

    def missing(self) -> list[str]:
        """The serving core's runtimes that have no plug-in."""
        return [name for name, c in serving_runtimes.RUNTIMES.items() if c not in self._of]

    def check(self) -> None:
        """TypeError naming any serving runtime without a plug-in."""
        if self.missing():
            raise TypeError(
                f"the serving core's runtimes {', '.join(self.missing())} have no pipeline "
                "plug-in: add a module of the same name to hf2triton/runtimes/ whose plug-in "
                "names the serving class (`serving = ...`), and import it in its __init__"
            )


PLUGINS = Plugins()


def is_default(runtime: dict[str, Any] | None) -> bool:
    """Whether `runtime` is the serving core's default (what a serving.json without one runs)."""
    return runtime is None or {k: runtime.get(k) for k in DEFAULT_RUNTIME} == DEFAULT_RUNTIME
