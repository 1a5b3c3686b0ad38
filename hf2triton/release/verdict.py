"""The gate's evidence: the report of every candidate, the smoke test's reference, the step's
result, and the one-line message when none passes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hf2triton.errors import AccuracyGateError
from hf2triton.kinds.base import Candidate, ModelKind, describe_misses, to_json
from hf2triton.release.plan import Gate, Reference
from hf2triton.release.report import publish_gate_failure
from hf2triton.util.cpu import cpu_features
from hf2triton.util.runs import in_prefect_run
from hf2triton.util.workspace import atomic_write_text


def new_report(gate: Gate) -> dict[str, Any]:
    return {
        "kind": gate.kind.name,
        "items": len(gate.gate_data),
        "cpu": cpu_features(),
        "thresholds": {k: v for k, (_, v) in gate.limits.items()},
        "limits": gate.limits,
        "smoke_limits": gate.smoke_limits,
        "config": to_json(gate.cfg.to_dict()),
        "batch": gate.batch,
        "candidates": [],
    }


def write_report(
    gate: Gate,
    report: dict[str, Any],
    chosen: Candidate | None,
    ref: Reference,
    out: Path,
    failed_report: Path,
    work_root: str,
) -> dict[str, Any]:
    """The gate's evidence: with a winner, validation_report.json and the smoke test's
    reference.json in the step's directory, and the step's result; without one, the report
    beside it and AccuracyGateError (published to Prefect's UI in a flow run)."""
    kind, quality = gate.kind, gate.quality
    text = json.dumps(to_json(report), indent=1, ensure_ascii=False)
    if chosen is None:
        atomic_write_text(failed_report, text)
        message = gate_message(kind, report, failed_report)
        if in_prefect_run():
            publish_gate_failure(Path(work_root).name, kind, report, message)
        raise AccuracyGateError(message)
    atomic_write_text(out / "validation_report.json", text)
    atomic_write_text(
        out / "reference.json",
        json.dumps(
            to_json(
                {
                    "kind": kind.name,
                    "config": gate.cfg.to_dict(),
                    "items": ref.smoke_data.items,
                    "reference": ref.smoke_outputs,
                    "limits": gate.smoke_limits,
                    "batch": gate.batch,
                }
            ),
            ensure_ascii=False,
        ),
    )
    shipped = next(e for e in report["candidates"] if e["name"] == chosen.name)
    return {
        "chosen": chosen.name,
        "onnx_path": chosen.onnx_path,
        "runtime": chosen.runtime,
        "metrics": to_json(shipped["metrics"]),
        "candidates": to_json(
            {
                c["name"]: {
                    **c["metrics"],
                    **{f"per_s_{k}": v for k, v in c.get("throughput", {}).items()},
                }
                for c in report["candidates"]
            }
        ),
        "items": len(gate.gate_data),
        "info": kind.info(ref.outputs),
        "champion": to_json(
            {**report.get("champion", {}), "candidate": shipped["metrics"].get(quality)}
            if quality
            else {}
        ),
    }


def gate_message(kind: ModelKind, report: dict[str, Any], path: Path) -> str:
    limits = report["limits"]
    smoke = limits
    parts = []
    for cand in report["candidates"]:
        if cand.get("error"):
            parts.append(f"{cand['name']}: refused, it raised {cand['error']}")
            continue
        own = {k: v for k, v in cand["misses"].items() if "." not in k}
        served = {
            k.removeprefix("smoke."): v for k, v in cand["misses"].items() if k.startswith("smoke.")
        }
        text = describe_misses(cand["metrics"], limits, own)
        if served:
            text += (
                ("; " if text else "")
                + "as the smoke test will query it: "
                + describe_misses(cand["smoke_metrics"], smoke, served)
            )
        if cand.get("champion_verdict"):
            champ = report["champion"]
            text += ("; " if text else "") + (
                f"{champ['metric']} {cand['metrics'][champ['metric']]:.4f} < "
                f"{champ['floor']:.4f}, the serving champion's (version {champ['version']}: "
                f"{champ['value']:.4f}) less validation.max_drop {champ['max_drop']} "
                f"[MLflow: {cand['champion_verdict']}]"
            )
        example = kind.example(cand["details"])
        parts.append(f"{cand['name']}: {text}" + (f"; {example}" if example else ""))
    closest = min(report["candidates"], key=lambda c: sum(c["misses"].values()))
    return (
        f"accuracy gate failed on {report['items']} validation {kind.item_word}; closest: "
        f"{closest['name']}. "
        + " | ".join(parts)
        + f". Nothing was registered or deployed. Full report: {path}. Relax "
        f"{kind.thresholds_key} only if these figures are acceptable for your use."
    )
