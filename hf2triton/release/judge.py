"""Judging one candidate: opened through the serving core (the code Triton runs), timed with a
short probe, scored against PyTorch one request at a time, in Triton's dynamic batches and on the
smoke test's own requests (the worst counts), against the champion's floor; a candidate that
breaks is refused with its error and the gate goes on."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from hf2triton.errors import AccuracyGateError
from hf2triton.kinds.base import Candidate, misses, timing_items, worst_of
from hf2triton.release.champion import mlflow_verdict
from hf2triton.release.plan import Gate, Reference, candidate_settings
from hf2triton.util.runs import step_logger


def answer_in_batches(
    model: Any, requests: list[dict[str, np.ndarray]], batch: int
) -> list[dict[str, np.ndarray]]:
    """`requests` through the served model as dynamic batches of `batch` requests."""
    answers: list[Any] = []
    for i in range(0, len(requests), batch):
        answers.extend(model.answer(requests[i : i + batch]))
    refused = [a for a in answers if isinstance(a, str)]
    if refused:
        raise AccuracyGateError(f"the served model refused a validation request: {refused[0]}")
    return answers


def judge_candidates(
    gate: Gate,
    candidates: list[Candidate],
    ref: Reference,
    report: dict[str, Any],
    floor: dict[str, Any],
    same: set[str],
) -> Candidate | None:
    """Judge the candidates into `report["candidates"]` in the gate's order (timed first and
    fastest first with select "fastest"), stopping at the first that passes unless the gate
    judges all; the candidate that ships, or None."""
    log = step_logger()
    order, speeds = candidates, {}
    if gate.select == "fastest":
        speeds, refused = probe_speeds(gate, candidates)
        report["candidates"] += refused
        order = sorted(
            (c for c in candidates if c.name in speeds), key=lambda c: -speeds[c.name]["speed"]
        )
    shipping = None
    for n, cand in enumerate(order, 1):
        if shipping and not gate.judge_all:
            report["candidates"].append(not_judged(cand, speeds[cand.name], shipping))
            continue
        log.info(
            "validate: candidate %d of %d, %s: %d %s",
            n,
            len(order),
            cand.name,
            len(gate.gate_data),
            gate.kind.item_word,
        )
        entry = measure_candidate(gate, cand, ref, report.get("champion", {}), floor, same)
        if cand.name in speeds:
            entry["throughput"] = speeds[cand.name]
        report["candidates"].append(entry)
        if not entry["misses"] and shipping is None:
            shipping = cand.name
            if gate.select == "first" and not gate.judge_all:
                break
    return choose(gate, candidates, report["candidates"])


def measure_candidate(
    gate: Gate,
    cand: Candidate,
    ref: Reference,
    champ: dict[str, Any],
    floor: dict[str, Any],
    same: set[str],
) -> dict[str, Any]:
    """One candidate through the serving core: scored one request at a time, in dynamic batches
    and on the smoke test's requests (the worst counts), against the champion's floor, and with
    a search, timed. Its report entry; `misses` is empty when it passes. A candidate that
    raises while it is built, opened or measured is refused with its error: the gate goes on."""
    t0 = time.perf_counter()
    model = None
    try:
        if cand.error:
            raise CandidateBroken(cand.error)
        model = gate.kind.open_candidate(
            cand.onnx_path, gate.export_dir, candidate_settings(gate.base, cand.gated_runtime)
        )
        return judge(gate, cand, model, ref, champ, floor, same, t0)
    except Exception as exc:  # noqa: BLE001 - a candidate that breaks is refused, not fatal
        return refusal(cand, exc, t0)
    finally:
        getattr(model, "close", lambda: None)()  # one candidate open at a time


class CandidateBroken(Exception):
    """A candidate that cannot be judged (its graph could not be built)."""


def refusal(cand: Candidate, exc: BaseException, t0: float) -> dict[str, Any]:
    """The report entry of a candidate that raised, and its log line."""
    why = (
        str(exc)
        if isinstance(exc, CandidateBroken)
        else f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    )
    step_logger().warning(
        "validate: %s: refused, it raised: %s (%.0f s)", cand.name, why, time.perf_counter() - t0
    )
    return {
        "name": cand.name,
        "runtime": cand.runtime,
        "gated_on": cand.gated_runtime,
        "metrics": {},
        "misses": {"error": float("inf")},
        "error": why,
        "smoke_metrics": {},
        "details": {},
        "worst": [],
        "champion_verdict": None,
    }


def judge(
    gate: Gate,
    cand: Candidate,
    model: Any,
    ref: Reference,
    champ: dict[str, Any],
    floor: dict[str, Any],
    same: set[str],
    t0: float,
) -> dict[str, Any]:
    """The report entry of an opened candidate."""
    kind, cfg, limits, quality = gate.kind, gate.cfg, gate.limits, gate.quality
    runs = []
    for size in (1, gate.batch):
        outputs = kind.extract(answer_in_batches(model, ref.requests, size))
        runs.append(kind.score(ref.outputs, outputs, gate.gate_data, cfg))
    metrics = worst_of([m for m, _ in runs], limits)
    # The details (worst examples) of the batching that did worst.
    details = (
        max(runs, key=lambda r: sum(misses(r[0], limits).values()))[1]
        if any(misses(r[0], limits) for r in runs)
        else runs[-1][1]
    )
    smoke_out = kind.extract(answer_in_batches(model, ref.smoke_requests, gate.batch))
    smoke_metrics, _ = kind.score(ref.smoke_outputs, smoke_out, ref.smoke_data, cfg)
    missed = misses(metrics, limits)
    # The gate's own limits on the smoke test's requests (the smoke test applies its own,
    # embedding.smoke_min_cosine, when the spec sets one).
    served_limits = {k: limits[k] for k in gate.smoke_limits if k in limits}
    missed.update({f"smoke.{k}": v for k, v in misses(smoke_metrics, served_limits).items()})
    verdict = None
    if floor and cand.name not in same:
        # MLflow's own model validation makes the call against the champion.
        verdict = mlflow_verdict(quality, metrics[quality], champ["value"], gate.max_drop)
        if verdict:
            missed[f"champion.{quality}"] = floor[quality][1] - metrics[quality]
    entry = {
        "name": cand.name,
        "runtime": cand.runtime,
        "gated_on": cand.gated_runtime,
        "metrics": metrics,
        "misses": missed,
        "smoke_metrics": smoke_metrics,
        "details": details,
        "worst": details.get("worst", []),
        "champion_verdict": verdict,
    }
    step_logger().info(
        "validate: %s: %s -> %s (%.0f s)",
        cand.name,
        ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k in limits),
        "misses the gate" if missed else "passes",
        time.perf_counter() - t0,
    )
    return entry


def probe_speeds(
    gate: Gate, candidates: list[Candidate]
) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """Each candidate opened, timed with a short probe at the serving batch (the kind's
    `speed`), and closed: one open at a time. The report entries of those that raise."""
    speeds, refused, log = {}, [], step_logger()
    items = timing_items(gate.gate_data.items)
    for n, cand in enumerate(candidates, 1):
        model, t0 = None, time.perf_counter()
        try:
            if cand.error:
                raise CandidateBroken(cand.error)
            model = gate.kind.open_candidate(
                cand.onnx_path, gate.export_dir, candidate_settings(gate.base, cand.gated_runtime)
            )
            speeds[cand.name] = gate.kind.speed(model, items, gate.batch)
            log.info(
                "validate: speed of candidate %d of %d, %s: %s",
                n,
                len(candidates),
                cand.name,
                ", ".join(f"{k} {v:g}" for k, v in speeds[cand.name].items() if k != "speed"),
            )
        except Exception as exc:  # noqa: BLE001 - a candidate that breaks is refused, not fatal
            refused.append(refusal(cand, exc, t0))
        finally:
            getattr(model, "close", lambda: None)()
    return speeds, refused


def not_judged(cand: Candidate, speed: dict[str, float], shipping: str) -> dict[str, Any]:
    """The report entry of a candidate slower than one that passed: timed, not judged."""
    return {
        "name": cand.name,
        "runtime": cand.runtime,
        "gated_on": cand.gated_runtime,
        "metrics": {},
        "misses": {},
        "judged": False,
        "throughput": speed,
        "status": f"not judged: slower than {shipping}, which passes (set "
        "validation.judge_all: true to judge every candidate)",
        "smoke_metrics": {},
        "details": {},
        "worst": [],
        "champion_verdict": None,
    }


def choose(
    gate: Gate, candidates: list[Candidate], entries: list[dict[str, Any]]
) -> Candidate | None:
    """The candidate that ships: the first that passes, or the fastest that passes; None when
    none passes."""
    passing = [e for e in entries if not e["misses"] and e.get("judged", True)]
    if not passing:
        return None
    best = (
        max(passing, key=lambda e: e["throughput"]["speed"])
        if gate.select == "fastest"
        else passing[0]
    )
    return next(c for c in candidates if c.name == best["name"])
