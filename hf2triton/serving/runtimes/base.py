"""What every serving runtime shares: the settings serving.json names (validated against the
runtime's table entry), the opened model's interface, and the table runtimes register in.
"""

from __future__ import annotations

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
    `max_rows` the most rows one run may have (None: any; engines built for a shape range),
    `pad_to` the token multiple its callers pad each run's width to, rows to a power of two (0:
    none; a runtime that compiles kernels per input shape asks for few shapes)."""

    settings: RuntimeSettings
    inputs: dict[str, Port]
    outputs: dict[str, Port]
    in_use: str
    max_rows: int | None = None
    pad_to: int = 0
    jobs: int = 1  # the runs `run_many` overlaps (OpenVINO: its streams' infer requests)

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
    # Settings measured on some tasks only: {setting: the spec's `task:` values it applies to}
    # (a release of another task that sets it is refused when its spec is read).
    tasks_of: ClassVar[dict[str, tuple[str, ...]]] = {}

    @classmethod
    def check(cls, options: dict[str, Any]) -> None:
        """ValueError naming a bad setting value."""
        for key, least in cls.at_least.items():
            value = options.get(key, least)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(
                    f"runtime {cls.name}: {key} must be a whole number >= {least}, got {value!r}"
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
    def needs_compressed_weights(cls, options: Mapping[str, Any]) -> str:
        """The setting among `options` that only applies beside compressed (int8 or int4)
        weights ("" when none does): a release that builds none cannot try it."""
        return ""

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
