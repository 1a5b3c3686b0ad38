"""What a runtime plug-in declares, and the graph variants the plug-ins build.

A runtime plug-in is the pipeline's side of one runtime of the serving core
(`hf2triton.serving.runtimes`, same name): the deploy device it serves, the precisions
`runtime.candidates: auto` tries on it, which graph formats it reads at which precision, the
graph variants it builds for itself (with their calibration) and its label. The serving core
opens and runs the model; the plug-in decides what the release tries.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypedDict

from hf2triton.serving.runtimes import DEFAULT_RUNTIME, RuntimeSettings, runtime_class
from hf2triton.util.workspace import cached_step, digest, source_digest

# Graph formats: what a variant's files are, so a runtime can say whether it reads them.
PLAIN = "onnx"  # the export as it is: a float ONNX graph every ONNX-reading runtime runs
ORT_ONLY = "onnx-ort"  # ONNX Runtime's own operators or quantization (int8, MatMulNBits, fused)
FP16 = "onnx-fp16"  # half-precision ONNX with fp32 inputs and outputs
# The same with ONNX Runtime's fused operators (Attention, SkipLayerNormalization, ...)
FP16_ORT = "onnx-fp16-ort"
OPENVINO_IR = "openvino-ir"  # OpenVINO IR: model.xml and model.bin
STATEFUL_IR = "openvino-stateful-ir"  # a decoder's OpenVINO IR with its KV cache as state


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


@dataclass(frozen=True)
class VariantContext:
    """What a plug-in's variant builders may use: the export, the model it came from, the spec's
    quantization section and the kind's calibration items."""

    onnx_path: str  # the fp32 export: a file, or (seq2seq) a directory
    export_dir: str
    model_dir: str  # the fetched Hugging Face directory
    kind: Any  # hf2triton.kinds.ModelKind
    quantization: Any  # hf2triton.runtimes.quantizers.QuantizationSpec
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


def build_variant(
    work: str,
    step: str,
    inputs: list[Any],
    build: Callable[[Path], dict],
    method: str,
    graph: str,
    main: str,
    source: Path,
) -> Variant:
    """A graph variant built once by `build(out_dir)` (a cached step of `work`, keyed by
    `inputs` and the building module's source): the file `main` in it (with files of the same
    stem: external data, OpenVINO's .bin), or with `main` "" the whole directory (seq2seq)."""
    started = time.perf_counter()
    key = digest([inputs, source_digest(sys.modules[build.__module__])])
    done = cached_step(work, step, key, build)
    path = done.path / main if main else done.path
    size = _size(path) + (
        sum(
            p.stat().st_size
            for p in path.parent.iterdir()
            if p != path and p.name.split(".")[0] == path.stem
        )
        if main
        else 0
    )
    return Variant(
        onnx_path=str(path),
        method=method,
        graph=graph,
        fallbacks=done.result.get("fallbacks", {}),
        fp32_bytes=_size(source),
        size_bytes=size,
        sha256=done.files[main] if main else digest(done.files),
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


def failed_variant(method: str, graph: str, exc: BaseException) -> Variant:
    """A variant whose build raised: kept, with why, so the gate refuses it by name."""
    first = str(exc).splitlines()[0][:300] if str(exc) else ""
    return Variant(
        onnx_path="",
        method=method,
        graph=graph,
        fallbacks={},
        fp32_bytes=0,
        size_bytes=0,
        sha256="",
        seconds=0.0,
        reused=False,
        error=f"building it failed: {type(exc).__name__}: {first}",
    )


class RuntimePlugin:
    """One runtime as the pipeline sees it. Subclasses set the class attributes (and override
    `variants` when they build graphs of their own); `RUNTIMES.register` keys them by `name`,
    the serving core's runtime they drive."""

    name: ClassVar[str]  # the serving core's runtime: "onnxruntime", "openvino", ...
    device: ClassVar[str]  # the deploy device it serves: "cpu" or "gpu"
    # What `runtime.candidates: auto` tries, in order: precisions, or (precision, options)
    # pairs (empty: only when listed).
    auto: ClassVar[tuple[str | tuple[str, dict[str, Any]], ...]] = ()
    # Graph formats it reads, per precision.
    reads: ClassVar[dict[str, frozenset[str]]] = {}
    # The model kinds it serves (None: every kind).
    kinds: ClassVar[frozenset[str] | None] = None

    @classmethod
    def serving_device(cls) -> str:
        """The serving core's device name ("cpu", "cuda")."""
        return runtime_class(cls.name).devices[0]

    @classmethod
    def serves(cls, kind: Any) -> bool:
        return cls.kinds is None or kind.name in cls.kinds

    @classmethod
    def runs(cls, variant: Variant, precision: str) -> bool:
        """Whether it runs `variant` at `precision`."""
        return variant["graph"] in cls.reads.get(precision, frozenset())

    @classmethod
    def settings(cls, precision: str, options: dict[str, Any]) -> RuntimeSettings:
        return RuntimeSettings(cls.name, cls.serving_device(), precision, options)

    @classmethod
    def recipes(cls, ctx: VariantContext) -> list[Recipe]:
        """The graph variants it builds for itself (none: it runs what others build)."""
        return []

    @staticmethod
    def label(runtime: dict[str, Any]) -> str:
        """The one label of a runtime in names, logs and reports: 'openvino bf16'."""
        return f"{runtime['name']} {runtime['precision']}"


def is_default(runtime: dict[str, Any] | None) -> bool:
    """Whether `runtime` is the serving core's default (what a serving.json without one runs)."""
    return runtime is None or {k: runtime.get(k) for k in DEFAULT_RUNTIME} == DEFAULT_RUNTIME
