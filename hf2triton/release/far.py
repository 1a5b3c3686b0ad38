"""Weights that miss by far: when a candidate misses a limit by far (hf2triton.kinds.limits
.far_misses) where another candidate on the same runtime settings but other weights did not,
the weights are what misses, and their other candidates (another compute precision, another KV
cache) are not judged; weights ruled out beside quantized activations (OpenVINO GenAI's
`dynamic_quantization`) are ruled out only there, since the activations may be what costs them.
SmolLM2-1.7B's shape had its int4 weights judged four times for 4 minutes
(next-token agreement 0.01 against 0.95 each time, where the f32 weights on the same settings
reached 0.78): this is what stops that. `validation.judge_all` judges them anyway."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hf2triton.kinds.base import Candidate
from hf2triton.kinds.limits import Limits, far_misses
from hf2triton.runtimes import plugin


def weights_of(cand: Candidate) -> str:
    """The variant whose weights `cand` runs (its name before " on " for a candidate made
    without it)."""
    return cand.weights or cand.name.split(" on ")[0]


@dataclass
class FarWeights:
    """What the judged candidates say of their weights: `why_not(cand)` is why a candidate is
    not judged ("" when it is)."""

    limits: Limits
    # runtime settings -> weights -> (candidate, its metrics, the metrics it misses by far)
    judged: dict[str, dict[str, tuple[str, dict[str, float], set[str]]]] = field(
        default_factory=dict
    )
    # weights -> where -> why ("" everywhere, else only on candidates that compute so)
    ruled_out: dict[str, dict[str, str]] = field(default_factory=dict)

    def why_not(self, cand: Candidate) -> str:
        where = self.ruled_out.get(weights_of(cand), {})
        return where.get("") or where.get(_computes(cand), "")

    def saw(self, cand: Candidate, entry: dict[str, Any]) -> None:
        """Learn from a judged candidate's entry: rule out weights that miss by far where other
        weights on the same runtime settings do not."""
        if not entry.get("metrics"):
            return
        key = json.dumps(cand.gated_runtime, sort_keys=True, default=str)
        same = self.judged.setdefault(key, {})
        metrics = entry["metrics"]
        same[weights_of(cand)] = (cand.name, metrics, set(far_misses(metrics, self.limits)))
        # Where the runtime computes beyond its precision (quantized activations), a rule-out
        # holds there only: the same weights may pass with exact activations.
        computes = _computes(cand)
        exact = computes == str((cand.gated_runtime or {}).get("precision", "fp32"))
        where = "" if exact else computes
        for weights, (name, missed, far) in same.items():
            for other, (other_name, reached, other_far) in same.items():
                blamed = far - other_far
                known = self.ruled_out.setdefault(weights, {})
                if weights != other and blamed and "" not in known and where not in known:
                    known[where] = self.because(
                        weights, min(blamed), (name, missed), (other_name, reached), where
                    )

    def because(
        self,
        weights: str,
        metric: str,
        missed: tuple[str, dict[str, float]],
        other: tuple[str, dict[str, float]],
        where: str = "",
    ) -> str:
        op, limit = self.limits[metric]
        scope = (
            f"ruled out where the runtime computes {where} only"
            if where
            else "another compute or KV cache precision does not make up for the weights"
        )
        return (
            f"not judged: its weights ({weights}) miss {metric} by far in {missed[0]} "
            f"({missed[1][metric]:.4f}, limit {op} {limit}) where {other[0]}, the same runtime "
            f"settings on other weights, reached {other[1][metric]:.4f}: {scope} (set "
            "validation.judge_all: true to judge every candidate)"
        )


def _computes(cand: Candidate) -> str:
    return plugin(cand.gated_runtime).computes(cand.gated_runtime or {})
