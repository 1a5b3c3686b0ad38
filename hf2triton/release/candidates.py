"""What the accuracy gate is asked to decide: which candidates it tries, in which order, how it
picks among those that pass, and whether they also face the serving champion.

The candidates are the graph variants in the order the quantize step built them (the spec's own
first), then, with `quantization.fallback_to_fp32` or a search, the fp32 export; each on the
runtimes the release tries (hf2triton.runtimes.runtime_choices) that read it: an int8 graph of
ONNX Runtime's quantizer on ONNX Runtime's CPU provider only, OpenVINO's IR on OpenVINO, a plain
float graph on every runtime. Without a search and with one runtime the first that passes ships;
otherwise the fastest that passes. With labelled validation data the candidates also face the model
the registry's `champion` alias serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from hf2triton.errors import SpecError
from hf2triton.kinds.base import Candidate, Data, ModelKind
from hf2triton.kinds.config import KindConfig
from hf2triton.release.champion import Champion, find_champion
from hf2triton.release.export import Exported
from hf2triton.release.plan import GateSettings
from hf2triton.release.results import ReleaseContext
from hf2triton.runtimes import Recipe, RuntimeChoices, Variant, VariantContext, label, plugin
from hf2triton.runtimes.base import is_default
from hf2triton.serving.runtimes import DEFAULT_RUNTIME
from hf2triton.sources import FetchResult
from hf2triton.spec import QuantizationSpec, ReleaseSpec


def variant_context(
    ctx: ReleaseContext, src: FetchResult, exp: Exported, quantization: QuantizationSpec
) -> VariantContext:
    """What the runtimes' variant builders read: the export, the model it came from, the spec's
    quantization section and the kind's calibration items (the quantize step builds with it,
    the gate builds the variants it planned)."""
    return VariantContext(
        onnx_path=exp["onnx_path"],
        export_dir=exp["export_dir"],
        model_dir=src["model_dir"],
        kind=ctx.kind,
        quantization=quantization,
        calibration=ctx.kind.calibration(ctx.data),
        max_length=exp["config"].get("max_length"),
        work=ctx.work,
    )


def gate_candidates(
    variants: list[Variant],
    quantization: QuantizationSpec,
    runtimes: RuntimeChoices | None = None,
    recipes: Mapping[str, Recipe] | None = None,
) -> list[Candidate]:
    """The candidates, in the order the gate tries them: each runtime's, in the order the
    runtimes were chosen, each of the variants it reads (a variant whose build failed too: the
    gate refuses it with its error; a planned one is built by its recipe in `recipes` when the
    gate needs it). The export itself (`fp32`, the last variant) is one only with method none,
    or with `quantization.fallback_to_fp32` or a search. `runtimes`: what the release may run
    on (default: ONNX Runtime on the CPU, fp32)."""
    runtimes = runtimes or RuntimeChoices([DEFAULT_RUNTIME])
    recipes = recipes or {}
    planned = [v["method"] for v in variants if v.get("planned") and v["method"] not in recipes]
    if planned:
        raise ValueError(f"planned variants without their recipe: {', '.join(planned)}")
    fp32_too = quantization.method == "none" or quantization.fallback_to_fp32 or quantization.search
    graphs = [v for v in variants if v["method"] != "fp32" or fp32_too]
    found = []
    for runtime in runtimes.served:
        runs = plugin(runtime)
        for v in graphs:
            if not runs.runs(v, runtime["precision"], runtime):
                continue
            # The default runtime's candidates are named after the graph alone.
            name = v["method"] if is_default(runtime) else f"{v['method']} on {runs.label(runtime)}"
            gated = runtimes.gated(runtime)
            found.append(
                Candidate(
                    name=name,
                    onnx_path=v["onnx_path"],
                    runtime=runtime,
                    gate_runtime=gated if gated != runtime else None,
                    error=v.get("error"),
                    weights=v["method"],
                    build=recipes[v["method"]].make if v.get("planned") else None,
                )
            )
    if not found:
        raise SpecError(
            f"none of the runtimes tried ({', '.join(label(r) for r in runtimes.served)}) "
            f"runs any graph this release built ({', '.join(v['method'] for v in graphs)}): "
            "list a runtime in runtime.candidates that reads them, or another quantization"
        )
    return found


def selection(
    quantization: QuantizationSpec, runtimes: RuntimeChoices | None = None
) -> Literal["first", "fastest"]:
    """How the gate picks among passing candidates: with a search, or several runtimes to
    choose from, the fastest; but where the gate checks a GPU's graphs on the CPU (gpu_gate
    cpu-numerics) the first, in the runtimes' own order: the CPU's speed says nothing of the
    GPU's (the fused fp16 graph is slower than fp32 on a CPU, 2.4x faster on an H100)."""
    if runtimes is not None and runtimes.cpu_numerics:
        return "first"
    several = runtimes is not None and len(runtimes.served) > 1
    return "fastest" if quantization.search or several else "first"


def champion_to_face(
    kind: ModelKind[KindConfig], data: Data, cfg: KindConfig, tracking_uri: str, model_name: str
) -> Champion | None:
    """The serving champion, when the data is labelled (there is a task metric to compare);
    None without labels or before the first release."""
    if not kind.labelled_metrics(kind.gate_data(data, cfg)):
        return None
    return find_champion(model_name, tracking_uri)


def gate_settings(spec: ReleaseSpec, runtimes: RuntimeChoices) -> GateSettings:
    """What the release asks of its gate: batches as Triton forms them (deploy), how it picks
    (quantization and the runtimes tried), how far below the champion (validation), and what
    this machine could not try."""
    return GateSettings(
        batch=spec.deploy.max_batch_size,
        max_batch_tokens=spec.deploy.max_batch_tokens,
        select=selection(spec.quantization, runtimes),
        max_drop=spec.validation.max_drop,
        judge_all=spec.validation.judge_all,
        not_offered=runtimes.not_offered,
        objective=spec.runtime.objective,
        prune=spec.quantization.prune,
    )
