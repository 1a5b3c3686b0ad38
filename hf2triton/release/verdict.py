"""The gate's evidence: the report of every candidate, the smoke test's reference, the step's
result, and the one-line message when none passes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf2triton.errors import AccuracyGateError
from hf2triton.kinds.base import Candidate, ModelKind, describe_misses, misses, to_json
from hf2triton.kinds.config import KindConfig
from hf2triton.kinds.margin import (
    EARLY_ALPHA,
    LEVEL,
    NARROW_TOLERANCE,
    Borderline,
    loosened,
    tolerance,
)
from hf2triton.release.plan import Gate, Reference
from hf2triton.release.report import publish_gate_failure
from hf2triton.serving.runtimes import runtime_class
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
        "margin": f"one-sided {LEVEL:.0%} bootstrap bound of every averaged metric"
        + (
            f", the sample sized by its bounds: looks at {list(gate.looks)} items, an early "
            f"one at the {1 - EARLY_ALPHA:.1%} bound"
            if len(gate.looks) > 1
            else ""
        ),
        "config": to_json(gate.cfg.to_dict()),
        "batch": gate.batch,
        "candidates": [],
    }


@dataclass(frozen=True)
class Written:
    """Where the gate's evidence goes: the step's directory `out` (a winner's report and
    reference), the failed report's path beside it, and the release's work root (named in
    Prefect's UI)."""

    out: Path
    failed_report: Path
    work_root: str


def write_report(
    gate: Gate, report: dict[str, Any], chosen: Candidate | None, ref: Reference, where: Written
) -> dict[str, Any]:
    """The gate's evidence: with a winner, validation_report.json and the smoke test's
    reference.json in the step's directory, and the step's result; without one, the report
    beside it and AccuracyGateError (published to Prefect's UI in a flow run)."""
    kind, quality = gate.kind, gate.quality
    out, failed_report, work_root = where.out, where.failed_report, where.work_root
    recorded = {e["name"]: e.pop("recorded", None) for e in report["candidates"]}
    text = json.dumps(to_json(report), indent=1, ensure_ascii=False)
    if chosen is None:
        atomic_write_text(failed_report, text)
        message = gate_message(kind, report, failed_report)
        if in_prefect_run():
            publish_gate_failure(Path(work_root).name, kind, report, message)
        raise AccuracyGateError(message)
    atomic_write_text(out / "validation_report.json", text)
    shipped = next(e for e in report["candidates"] if e["name"] == chosen.name)
    smoke = smoke_reference(gate, ref, chosen, shipped, recorded[chosen.name], report)
    atomic_write_text(out / "reference.json", json.dumps(to_json(smoke), ensure_ascii=False))
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
        "built": report.get("built", []),
        "info": kind.info(ref.outputs),
        "champion": to_json(
            {**report.get("champion", {}), "candidate": shipped["metrics"].get(quality)}
            if quality
            else {}
        ),
    }


def smoke_reference(
    gate: Gate,
    ref: Reference,
    chosen: Candidate,
    shipped: dict[str, Any],
    recorded: dict[str, Any],
    report: dict[str, Any],
) -> dict[str, Any]:
    """reference.json: the smoke test's items and what the shipped candidate answered them in
    the gate (one at a time and in the smoke test's batches), and the limits the endpoint is
    held to against those answers: the agreement the served precision allows, no tighter than
    the candidate's own answers alone and batched agreed in the gate. PyTorch's answers stay
    beside them (for the report; the smoke test no longer scores against them)."""
    kind = gate.kind
    runtime = chosen.runtime or {}
    slack = tolerance(runtime.get("precision"))
    if chosen.gated_runtime != chosen.runtime:  # recorded on another runtime (CPU numerics)
        slack = max(slack, NARROW_TOLERANCE)
    limits = loosened(kind.agreement_limits(slack), shipped["batch_invariance"], slack)
    return {
        "kind": kind.name,
        "config": gate.cfg.to_dict(),
        "items": ref.smoke_data.items,
        "reference": ref.smoke_outputs,
        "candidate": chosen.name,
        "recorded": recorded,
        "limits": limits,
        "batch": gate.batch,
        "next": next_candidate(chosen.name, report),
    }


def pinned(runtime: dict[str, Any]) -> str:
    """A runtime as runtime.candidates lists it: its name, precision and the options it set
    away from their defaults ("{name: openvino-genai, precision: fp32, options: {kv_cache:
    u8}}")."""
    defaults = runtime_class(runtime["name"]).options
    options = {k: v for k, v in runtime.items() if k in defaults and v != defaults[k]}
    listed = ", ".join(f"{k}: {v}" for k, v in options.items())
    return (
        f"{{name: {runtime['name']}, precision: {runtime['precision']}"
        + (f", options: {{{listed}}}" if listed else "")
        + "}"
    )


def next_candidate(chosen: str, report: dict[str, Any]) -> str:
    """What to ship if the endpoint does not serve what the gate judged: the next candidate
    that passed, and how to pin it; or how to find one."""
    passed = [
        e
        for e in report["candidates"]
        if e["name"] != chosen and e.get("judged", True) and not e["misses"]
    ]
    if passed:
        runtime = passed[0].get("runtime") or {"name": "onnxruntime", "precision": "fp32"}
        return (
            f"The next candidate that passed the gate is {passed[0]['name']}: to ship it, pin "
            f"runtime.candidates: [{pinned(runtime)}] and run the release again"
        )
    unjudged = [e["name"] for e in report["candidates"] if e.get("judged") is False]
    if unjudged:
        return (
            f"No other candidate was judged ({', '.join(unjudged)} were not: set "
            "validation.judge_all: true to judge them all, then pin one with runtime.candidates)"
        )
    return "No other candidate passed the gate"


def gate_message(kind: ModelKind[KindConfig], report: dict[str, Any], path: Path) -> str:
    limits = report["limits"]
    parts = []
    for cand in report["candidates"]:
        if cand.get("error"):
            parts.append(f"{cand['name']}: refused, it raised {cand['error']}")
            continue
        own = {k: v for k, v in cand["misses"].items() if "." not in k and k in limits}
        text = describe_misses(cand["metrics"], limits, own)
        for name, figure in cand.get("served_checks", {}).items():
            if name in cand["misses"]:
                text += ("; " if text else "") + f"{name.replace('_', ' ')}: {figure}"
        hairs = [
            Borderline(
                m, b["value"], b["bound"], b["limit"], b["op"], b.get("level", LEVEL)
            ).describe()
            for m, b in cand.get("borderline", {}).items()
        ]
        if hairs:
            text += ("; " if text else "") + "borderline: " + "; ".join(hairs)
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
    own = report.get("pytorch", {})
    short = misses(own, limits)
    itself = (
        f" PyTorch's own answers miss too ({describe_misses(own, limits, short)}): the model "
        f"itself, not its export, misses {', '.join(short)}."
        if short
        else ""
    )
    return (
        f"accuracy gate failed on {report['items']} validation {kind.item_word}; closest: "
        f"{closest['name']}. "
        + " | ".join(parts)
        + f".{itself} Nothing was registered or deployed. Full report: {path}. Relax "
        f"{kind.thresholds_key} only if these figures are acceptable for your use."
    )
