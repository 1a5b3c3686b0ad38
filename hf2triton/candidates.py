"""What the accuracy gate is asked to decide: which candidates it tries, in which order, how it
picks among those that pass, and whether they also face the serving champion.

The candidates are the quantized variants in the order quantization made them (the spec's own
first), then, with `quantization.fallback_to_fp32` or a search, the fp32 export. Without a search
the first that passes ships; with one, the fastest that passes. With labelled validation data the
candidates also face the model the registry's `champion` alias serves.
"""

from __future__ import annotations

from typing import Any, Literal

from hf2triton.champion import Champion, find_champion
from hf2triton.kinds.base import Candidate, Data, ModelKind


def gate_candidates(variants: list[dict[str, Any]], fp32_onnx: str, quantization: Any
                    ) -> list[Candidate]:
    """The candidates, in the order the gate tries them. `quantization` is the spec's section
    (method, fallback_to_fp32, search)."""
    found = [Candidate(name=v["method"], onnx_path=v["onnx_path"]) for v in variants]
    if quantization.method != "none" and (quantization.fallback_to_fp32 or quantization.search):
        found.append(Candidate(name="fp32", onnx_path=fp32_onnx))
    return found


def selection(quantization: Any) -> Literal["first", "fastest"]:
    """How the gate picks among passing candidates: with a search, the fastest."""
    return "fastest" if quantization.search else "first"


def champion_to_face(kind: ModelKind, data: Data, cfg: Any, tracking_uri: str
                     ) -> Champion | None:
    """The serving champion, when the data is labelled (there is a task metric to compare);
    None without labels or before the first release."""
    if not kind.labelled_metrics(kind.gate_data(data, cfg)):
        return None
    return find_champion(kind.spec.registry.model_name, tracking_uri)
