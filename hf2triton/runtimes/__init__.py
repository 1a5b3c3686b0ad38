"""Runtimes as plug-ins, on the pipeline's side. The one table of runtimes is the serving core's
(hf2triton.serving.runtimes.RUNTIMES: what opens a model for a device and precision); each has
one plug-in here, in a module of the same name, that names its serving class (`serving =
serving_runtimes.OpenVino`) and registers where it is defined (`@PLUGINS.register`). A plug-in
says which deploy device it serves, which precisions `runtime.candidates: auto` tries, which
graph formats it reads, which graph variants it builds (and calibrates) for itself, and its
label; the quantize step, the candidates, the devices and the repository ask it, never a name.

A new runtime is a module in hf2triton/serving/runtimes/ and a module of the same name here,
its name in the import line below: importing this package fails while a serving runtime has no
plug-in.

Example:
    >>> plugin({"name": "openvino"}).device, plugin({"name": "openvino"}).auto
    ('cpu', ('fp32', 'bf16'))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from hf2triton.errors import EnvironmentSetupError

# The plug-in modules, imported so that each registers its plug-in in PLUGINS.
from hf2triton.runtimes import (  # noqa: F401
    onnxruntime,
    onnxruntime_cuda,
    onnxruntime_tensorrt,
    openvino,
    openvino_genai,
)
from hf2triton.runtimes.base import (
    FROM_SOURCE,
    PLUGINS,
    Recipe,
    RuntimePlugin,
    Variant,
    VariantContext,
    export_variant,
)
from hf2triton.runtimes.devices import DEVICES, DeployOn
from hf2triton.serving import runtimes as serving_runtimes
from hf2triton.serving.runtimes import DEFAULT_RUNTIME

if TYPE_CHECKING:
    from hf2triton.kinds.base import ModelKind

PLUGINS.check()  # every serving runtime has its plug-in


def plugin(runtime: Mapping[str, Any] | None) -> type[RuntimePlugin]:
    """The plug-in of a serving.json `runtime` (None: the default)."""
    return PLUGINS.load((runtime or DEFAULT_RUNTIME)["name"])


def label(runtime: dict[str, Any] | None) -> str:
    """'openvino bf16': how a runtime is named in candidates, logs and reports."""
    return plugin(runtime).label(runtime or DEFAULT_RUNTIME)


@dataclass(frozen=True)
class RuntimeChoices:
    """What the gate tries: serving.json `runtime` settings, in order, and what was asked for but
    is not offered on this machine, with why."""

    served: list[dict[str, Any]]
    not_offered: dict[str, str] = field(default_factory=dict)
    # with gpu_gate cpu-numerics: the gate runs each on a CPU runtime at the same precision
    cpu_numerics: bool = False
    device: str = "cpu"  # deploy.device
    # Under auto: each runtime left out because it yields the kind to another (a plug-in's
    # `yields_to`), by its label: (its settings, the other's name). `for_model` takes them back
    # where the other cannot serve the model.
    yielded: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)

    def plugins(self) -> list[type[RuntimePlugin]]:
        """The plug-ins of the runtimes tried, each once, in order."""
        return list(dict.fromkeys(plugin(r) for r in self.served))

    def for_model(self, kind: ModelKind, model_dir: str) -> RuntimeChoices:
        """These choices for the model in `model_dir`: a runtime that yielded to one which
        cannot serve it faithfully (OpenVINO GenAI and a generation config it would not honour)
        is tried again."""
        refused = {
            other
            for other in {o for _, o in self.yielded.values()}
            if PLUGINS.load(other).refuses(kind, model_dir)
        }
        back = {name: r for name, (r, other) in self.yielded.items() if other in refused}
        if not back:
            return self
        return replace(
            self,
            served=[*back.values(), *self.served],
            not_offered={k: v for k, v in self.not_offered.items() if k not in back},
            yielded={k: v for k, v in self.yielded.items() if k not in back},
        )

    def read_export(self) -> bool:
        """Whether a runtime tried reads a graph made from the ONNX export (else the release
        exports none: each graph is made from the source model by its runtime's recipe)."""
        return any(
            plugin(r).reads.get(r["precision"], frozenset()) - FROM_SOURCE for r in self.served
        )

    def gated(self, served: dict[str, Any]) -> dict[str, Any]:
        """The runtime the gate runs for a served one (the same, but for a CPU numerics check
        of a GPU runtime)."""
        return DEVICES.load(self.device).numerics_runtime(served) if self.cpu_numerics else served


class RuntimeAsked(Protocol):
    """One runtime the spec lists (hf2triton.spec's RuntimeChoice; the spec is a layer above)."""

    @property
    def name(self) -> str: ...
    @property
    def precision(self) -> str: ...
    @property
    def options(self) -> Mapping[str, Any]: ...


class RuntimesAsked(Protocol):
    """The spec's `runtime:` section (hf2triton.spec's RuntimeSpec) as runtime_choices reads it."""

    @property
    def candidates(self) -> Literal["auto"] | Sequence[RuntimeAsked]: ...
    @property
    def objective(self) -> Literal["throughput", "latency"]: ...


def runtime_choices(
    deploy: DeployOn, runtime_spec: RuntimesAsked, kind: ModelKind | None = None
) -> RuntimeChoices:
    """The runtimes the release's candidates run on: the spec's list, or for `auto` every
    plug-in of deploy.device that serves the kind, at its auto precisions (and, under the
    latency objective, its `latency` settings after them); a precision this
    machine does not offer (bf16 on a CPU without AVX512_BF16 or AMX) is left out and
    reported."""
    device = DEVICES.load(deploy.device)
    not_offered = {}
    if runtime_spec.candidates != "auto":
        wanted = [
            (PLUGINS.load(c.name), c.precision, dict(c.options)) for c in runtime_spec.candidates
        ]
        for p, precision, options in list(wanted):
            if kind is not None and not p.serves(kind):
                wanted.remove((p, precision, options))
                not_offered[p.label(p.settings(precision, options).to_dict())] = (
                    f"it does not serve {kind.name} (it serves {', '.join(sorted(p.kinds or ()))})"
                )
    else:
        wanted = [
            (p, *(entry if isinstance(entry, tuple) else (entry, {})))
            for p in PLUGINS.values()
            if p.device == device.name and (kind is None or p.serves(kind))
            for entry in (p.auto + p.latency if runtime_spec.objective == "latency" else p.auto)
        ]
    cpu_numerics = device.gate_on_cpu(deploy)
    info = serving_runtimes.runtime_info()  # what this machine offers, asked now
    served = []
    for runtime, precision, options in wanted:
        settings = runtime.settings(precision, options)
        served_runtime = {
            k: v for k, v in settings.to_dict().items() if k != "threads" or k in options
        }  # deploy.intra_op_threads rules
        offered = info.get(runtime.name, {}).get(settings.device, {})
        if not cpu_numerics and settings.precision not in offered.get("precisions", []):
            not_offered[runtime.label(served_runtime)] = offered.get("why") or "not available here"
            continue
        served.append(served_runtime)
    yielded: dict[str, tuple[dict[str, Any], str]] = {}
    if runtime_spec.candidates == "auto" and kind is not None:
        served, yielded = _without_yielded(served, kind, not_offered)
    if not served:
        raise EnvironmentSetupError(
            f"none of the runtimes asked for can run here: "
            f"{'; '.join(f'{k}: {v}' for k, v in not_offered.items())}. Install what they need, "
            "or list others in runtime.candidates"
        )
    return RuntimeChoices(served, not_offered, cpu_numerics, device.name, yielded)


def _without_yielded(
    served: list[dict[str, Any]], kind: ModelKind, not_offered: dict[str, str]
) -> tuple[list[dict[str, Any]], dict[str, tuple[dict[str, Any], str]]]:
    """`served` less the runtimes that leave `kind` to another one offered among them (a
    plug-in's `yields_to`), each reported with why; and those left out."""
    names = {r["name"] for r in served}
    kept, yielded = [], {}
    for r in served:
        other, why = plugin(r).yields_to.get(kind.name, ("", ""))
        if other in names:
            not_offered[label(r)] = why
            yielded[label(r)] = (r, other)
        else:
            kept.append(r)
    return kept, yielded


def recipes(ctx: VariantContext, choices: RuntimeChoices) -> dict[str, Recipe]:
    """How each graph variant the chosen runtimes build is made, by its name, in order: each
    plug-in's, its own first (the spec's variant), each variant once."""
    found: dict[str, Recipe] = {}
    for p in choices.plugins():
        if p.serves(ctx.kind):
            for r in p.recipes(ctx):
                found.setdefault(r.method, r)
    return found


def build_variants(
    ctx: VariantContext, choices: RuntimeChoices, every: bool = True
) -> list[Variant]:
    """The graph variants the chosen runtimes build (each once; one whose build raises is kept
    with its error, for the gate to refuse), then the export itself (`fp32`) where the release
    exported a graph (RuntimeChoices.read_export). With `every`
    False only each plug-in's first variant is built (what the search times first); the others
    are `planned`, built by the gate when it needs them (hf2triton.release.search)."""
    firsts = {
        rs[0].method for p in choices.plugins() if p.serves(ctx.kind) and (rs := p.recipes(ctx))
    }
    return [
        r.make() if every or method in firsts else r.planned()
        for method, r in recipes(ctx, choices).items()
    ] + ([export_variant(ctx)] if ctx.onnx_path else [])


__all__ = [
    "PLUGINS",
    "Recipe",
    "RuntimeAsked",
    "RuntimeChoices",
    "RuntimePlugin",
    "Variant",
    "RuntimesAsked",
    "VariantContext",
    "build_variants",
    "label",
    "recipes",
    "plugin",
    "runtime_choices",
]
