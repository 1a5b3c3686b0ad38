"""What the accuracy gate is asked to decide: which candidates it tries, in which order, how it
picks among those that pass, and whether they also face the serving champion.

The candidates are the quantized variants in the order quantization made them (the spec's own
first), then, with `quantization.fallback_to_fp32` or a search, the fp32 export; each on the
runtimes the release tries (hf2triton.devices.runtime_choices): an int8 graph of ONNX Runtime's
quantizer on ONNX Runtime's CPU provider only, a plain float graph on every runtime. Without a
search and with one runtime the first that passes ships; otherwise the fastest that passes.
With labelled validation data the candidates also face the model the registry's `champion`
alias serves.
"""

from __future__ import annotations

from typing import Any, Literal

from hf2triton.champion import Champion, find_champion
from hf2triton.devices import RuntimeChoices, label
from hf2triton.kinds.base import Candidate, Data, ModelKind

# Graphs every runtime reads: the export as it is (a copy named "none" with method none).
# Quantized and ORT-fused or -optimised graphs hold ONNX Runtime's own operators.
PLAIN_GRAPHS = ("fp32", "none")
DEFAULT_RUNTIME = {"name": "onnxruntime", "device": "cpu", "precision": "fp32"}


def gate_candidates(variants: list[dict[str, Any]], fp32_onnx: str, quantization: Any,
                    runtimes: RuntimeChoices | None = None) -> list[Candidate]:
    """The candidates, in the order the gate tries them. `quantization` is the spec's section
    (method, fallback_to_fp32, search); `runtimes` what the release may run on (default:
    ONNX Runtime on the CPU, fp32)."""
    runtimes = runtimes or RuntimeChoices([DEFAULT_RUNTIME])
    graphs = [(v["method"], v["onnx_path"]) for v in variants]
    if quantization.method != "none" and (quantization.fallback_to_fp32 or quantization.search):
        graphs.append(("fp32", fp32_onnx))
    found = []
    for runtime in runtimes.served:
        for graph, path in graphs:
            if not suits(graph, runtime):
                continue
            # Today's candidates keep today's names; another runtime is named after the graph.
            name = graph if runtime == DEFAULT_RUNTIME else f"{graph} on {label(runtime)}"
            gated = runtimes.gated(runtime)
            found.append(Candidate(name=name, onnx_path=path, runtime=runtime,
                                   gate_runtime=gated if gated != runtime else None))
    return found


def suits(graph: str, runtime: dict[str, Any]) -> bool:
    """Whether `runtime` runs the graph variant `graph`: an fp16 graph on an fp16 runtime only;
    ONNX Runtime on the CPU every other graph (its quantized and fused ones too); any other
    runtime the plain export only."""
    if runtime["precision"] == "fp16" or graph.startswith("fp16"):
        return runtime["precision"] == "fp16" and graph.startswith("fp16")
    if graph.startswith("openvino"):  # OpenVINO IR: its own runtime reads it
        return runtime["name"] == "openvino"
    return runtime["name"] == "onnxruntime" or graph in PLAIN_GRAPHS


def selection(quantization: Any, runtimes: RuntimeChoices | None = None
              ) -> Literal["first", "fastest"]:
    """How the gate picks among passing candidates: with a search, or several runtimes to
    choose from, the fastest."""
    several = runtimes is not None and len(runtimes.served) > 1
    return "fastest" if quantization.search or several else "first"


def champion_to_face(kind: ModelKind, data: Data, cfg: Any, tracking_uri: str
                     ) -> Champion | None:
    """The serving champion, when the data is labelled (there is a task metric to compare);
    None without labels or before the first release."""
    if not kind.labelled_metrics(kind.gate_data(data, cfg)):
        return None
    return find_champion(kind.spec.registry.model_name, tracking_uri)
