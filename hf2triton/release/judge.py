"""Judging one candidate: opened through the serving core (the code Triton runs), timed with a
short probe, scored against PyTorch one request at a time, in Triton's dynamic batches and on the
smoke test's own requests (the worst counts), against the champion's floor; a candidate that
breaks is refused with its error and the gate goes on."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hf2triton.errors import AccuracyGateError
from hf2triton.kinds.base import Candidate, misses, worst_of
from hf2triton.kinds.margin import Borderline, Sample, borderline, look_level, settled
from hf2triton.release.far import FarWeights
from hf2triton.release.plan import Facing, Gate, Reference, candidate_settings
from hf2triton.release.search import CandidateBroken, Search, bare_entry, refusal
from hf2triton.targets.smoke import groups
from hf2triton.util.runs import step_logger

if TYPE_CHECKING:
    from hf2triton.serving.base import ServedModel


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
    gate: Gate, candidates: list[Candidate], ref: Reference, report: dict[str, Any], facing: Facing
) -> Candidate | None:
    """Judge the candidates into `report["candidates"]` in the search's order (hf2triton.release
    .search: timed first, fastest first, pruned by runtime, with select "fastest"); once one
    passes, only a candidate timed faster than it is judged (another runtime's, whose first ran
    faster), unless the gate judges all; the candidate that ships (built), or None."""
    search, far = Search(gate, candidates), FarWeights(gate.limits)
    shipping: str | None = None
    done: list[dict[str, Any]] = []
    for group in search.groups():
        for cand in group:
            if shipping and not gate.judge_all and not faster(search, cand):
                done.append(not_judged(cand, search.speeds[cand.name], shipping))
                continue
            if far.why_not(cand) and not gate.judge_all:
                done.append(ruled_out(cand, search.speeds.get(cand.name), far.why_not(cand)))
                continue
            step_logger().info(
                "validate: candidate %d of %d, %s: %s %s",
                len(done) + 1,
                len(candidates),
                cand.name,
                gate.sized,
                gate.kind.item_word,
            )
            entry = measure_candidate(gate, search.build(cand), ref, facing)
            if cand.name in search.speeds:
                entry["throughput"] = search.speeds[cand.name]
            done.append(entry)
            far.saw(cand, entry)
            if not entry["misses"] and (shipping is None or faster(search, cand)):
                shipping = cand.name
                search.bar = search.speeds.get(cand.name, {}).get("speed", -1.0)
                if gate.select == "first" and not gate.judge_all:
                    break
        if shipping and not gate.judge_all and gate.select == "first":
            break
    reported = {e["name"] for e in done} | {e["name"] for e in search.refused}
    for cand in candidates if gate.select == "fastest" else []:
        if cand.name not in reported:
            done.append(
                not_judged(cand, search.speeds[cand.name], shipping or "")
                if cand.name in search.speeds and shipping
                else search.untimed(cand, shipping)
            )
    report["candidates"] += search.refused + done
    # The graphs the gate built itself (planned ones): what the release may tidy away after.
    report["built"] = [
        c.onnx_path
        for c in search.made.values()
        if c.onnx_path and any(p.name == c.name and p.planned for p in candidates)
    ]
    return choose(gate, list(search.made.values()), report["candidates"])


def faster(search: Search, cand: Candidate) -> bool:
    """Whether `cand` was timed faster than the fastest candidate that passed so far (with
    select "fastest"; no other candidate is judged once one passed)."""
    speed = search.speeds.get(cand.name, {}).get("speed")
    return speed is not None and search.bar >= 0 and speed > search.bar


def measure_candidate(
    gate: Gate, cand: Candidate, ref: Reference, facing: Facing
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
        return judge(gate, cand, model, ref, facing, t0)
    except Exception as exc:  # noqa: BLE001 - a candidate that breaks is refused, not fatal
        return refusal(cand, exc, t0)
    finally:
        getattr(model, "close", lambda: None)()  # one candidate open at a time


@dataclass(frozen=True)
class Scored:
    """A candidate's figures against PyTorch: the worst of one request at a time and Triton's
    batches (`metrics`), the details of the batching that did worst, each average's bound, the
    metrics it passes by a hair, its answers alone and batched, and how many of the gate's
    items they were judged on (the look that settled it: `Gate.looks`)."""

    metrics: dict[str, float]
    details: dict[str, Any]
    bounds: dict[str, float]
    hairs: dict[str, Borderline]
    outputs: list[Any]
    items: int = 0
    samples: tuple[dict[str, Sample], ...] = ()  # each run's, for a look's verdict


def score_runs(gate: Gate, model: ServedModel, ref: Reference) -> Scored:
    """The candidate scored in Triton's dynamic batches, then one request at a time (`outputs`
    in that order); a candidate that misses in batches misses the gate (the worst run counts),
    so the slower run alone is left out unless the gate judges all. Look by look (`Gate.looks`):
    the gate's first items, then more (PyTorch's answers on them computed once, `Reference.upto`)
    only while the bounds at the look's level leave the verdict open."""
    sizes = gate.looks or (len(gate.gate_data),)
    answered: list[list[Any]] = []
    for look, n in enumerate(sizes):
        level = look_level(look, len(sizes))
        scored = score_look(gate, model, ref.upto(n), n, answered, level)
        if look == len(sizes) - 1 or settled_at(gate, scored, level) is not None:
            return scored
    raise AssertionError("a gate has at least one look")


def score_look(
    gate: Gate, model: ServedModel, ref: Reference, n: int, answered: list[list[Any]], level: float
) -> Scored:
    """The candidate's figures on the gate's first `n` items: the runs in batches and alone,
    the worst of them, each average's bound at `level`. `answered` keeps each run's answers to
    the earlier looks' items, in chunks (the kind's `extract` of each; a list per item where
    the kind sizes its sample), and gains this look's."""
    kind, cfg, limits, data = gate.kind, gate.cfg, gate.limits, gate.items(n)
    reference = ref.outputs if n >= len(gate.gate_data) else ref.outputs[:n]
    runs = []
    for run, size in enumerate((gate.batch, 1)):
        if run == len(answered):
            answered.append([])
        have = sum(len(chunk) for chunk in answered[run])
        answered[run].append(kind.extract(answer_in_batches(model, ref.requests[have:n], size)))
        out = joined(answered[run])
        metrics_run, details_run = kind.score(reference, out, data, cfg)
        samples = kind.samples(reference, out, data, cfg)
        runs.append(
            (metrics_run, details_run, *borderline(metrics_run, samples, limits, level), samples)
        )
        if misses(metrics_run, limits) and not gate.judge_all:
            break  # the slower run alone is not answered at this look (its earlier answers kept)
    # The details (worst examples) of the batching that did worst.
    details = (
        max(runs, key=lambda r: sum(misses(r[0], limits).values()))[1]
        if any(misses(r[0], limits) for r in runs)
        else runs[-1][1]
    )
    return Scored(
        metrics=worst_of([r[0] for r in runs], limits),
        details=details,
        bounds=worst_of([r[2] for r in runs], limits) if runs[0][2] else {},
        hairs=worst_hairs([b for r in runs for b in r[3]]),
        outputs=[joined(chunks) for chunks in answered[: len(runs)]],
        items=n,
        samples=tuple(r[4] for r in runs),
    )


def joined(chunks: list[Any]) -> Any:
    """One run's answers: the one chunk as the kind extracted it, or the looks' chunks as one
    list."""
    return chunks[0] if len(chunks) == 1 else [x for chunk in chunks for x in chunk]


def settled_at(gate: Gate, scored: Scored, level: float) -> bool | None:
    """Whether an early look settles the candidate: True passes, False misses (the run that
    did worst decides), None leaves it to the next look."""
    verdicts = [settled(scored.metrics, samples, gate.limits, level) for samples in scored.samples]
    if False in verdicts:
        return False
    return True if all(verdicts) else None


def worst_hairs(found: list[Borderline]) -> dict[str, Borderline]:
    """Per metric, the borderline of the batching that measured it worst (the value the gate's
    metrics report), whichever order the batchings ran in."""
    hairs: dict[str, Borderline] = {}
    for b in found:
        seen = hairs.get(b.metric)
        if seen is None or (b.value < seen.value if b.op == ">=" else b.value > seen.value):
            hairs[b.metric] = b
    return hairs


def judge(
    gate: Gate, cand: Candidate, model: ServedModel, ref: Reference, facing: Facing, t0: float
) -> dict[str, Any]:
    """The report entry of an opened candidate: its metrics against PyTorch (the worst of one
    request at a time and Triton's batches), each average's bound (a candidate that passes by a
    hair is borderline, and misses), how far its own answers move with the batch, and what it
    answers to the smoke test's requests (`recorded`, what the smoke test holds the endpoint
    to)."""
    kind = gate.kind
    scored = score_runs(gate, model, ref)
    missed = misses(scored.metrics, gate.limits)
    missed.update({f"margin.{m}": b.short for m, b in scored.hairs.items() if m not in missed})
    checks, failed = kind.served_checks(model, gate.gate_data)
    missed.update(failed)
    verdict = facing.judge(gate, cand.name, scored.metrics, missed)
    # The same candidate alone and batched: 1.0 (or 0) where its answers do not move (not
    # measured where it missed in batches).
    itself: dict[str, float] = {}
    if len(scored.outputs) == 2:
        batched, alone = scored.outputs
        itself, _ = kind.score(
            kind.as_reference(alone), batched, gate.items(scored.items), gate.cfg
        )
    entry = {
        "name": cand.name,
        "runtime": cand.runtime,
        "gated_on": cand.gated_runtime,
        "metrics": scored.metrics,
        "bounds": scored.bounds,
        "borderline": {m: b.as_dict() for m, b in scored.hairs.items()},
        "misses": missed,
        "served_checks": checks,
        "batch_invariance": {k: itself[k] for k in kind.agreement_limits(0.0) if k in itself},
        "runs": ["in batches", "one at a time"][: len(scored.outputs)],
        "items": scored.items,
        "details": scored.details,
        "worst": scored.details.get("worst", []),
        "champion_verdict": verdict,
        "recorded": record_smoke(gate, model, ref),
    }
    log_judged(gate, cand, entry, scored.hairs, t0)
    return entry


def log_judged(
    gate: Gate, cand: Candidate, entry: dict[str, Any], hairs: dict[str, Borderline], t0: float
) -> None:
    """A judged candidate's log lines: its figures and verdict, its served checks, and each
    metric it passes by a hair."""
    log, missed = step_logger(), entry["misses"]
    n, total = entry["items"], len(gate.gate_data)
    log.info(
        "validate: %s: %s -> %s%s (%.0f s)",
        cand.name,
        ", ".join(f"{k} {v:.4f}" for k, v in entry["metrics"].items() if k in gate.limits),
        "borderline"
        if hairs and missed.keys() <= {f"margin.{m}" for m in hairs}
        else "misses the gate"
        if missed
        else "passes",
        f" on the first {n} of {total} {gate.kind.item_word}, settled by its bounds"
        if n < total
        else "",
        time.perf_counter() - t0,
    )
    for what, figure in entry["served_checks"].items():
        log.info("validate: %s: %s %s", cand.name, what.replace("_", " "), figure)
    for b in hairs.values():
        log.info(
            "validate: %s is borderline: %s; the next candidate is judged", cand.name, b.describe()
        )


def record_smoke(gate: Gate, model: Any, ref: Reference) -> dict[str, Any]:
    """What the candidate answers to the smoke test's requests as the smoke test sends them:
    one at a time, and in the batches it merges (`smoke.groups`), in `score`'s reference
    form."""
    kind, recorded = gate.kind, {}
    for size in (1, gate.batch):
        answers: list[Any] = []
        for group in groups(ref.smoke_requests, size):
            answers.extend(
                answer_in_batches(model, [ref.smoke_requests[i] for i in group], len(group))
            )
        recorded[str(size)] = kind.as_reference(kind.extract(answers))
    return recorded


def not_judged(cand: Candidate, speed: dict[str, float], shipping: str) -> dict[str, Any]:
    """The report entry of a candidate slower than one that passed: timed, not judged."""
    return bare_entry(
        cand,
        judged=False,
        throughput=speed,
        status=f"not judged: slower than {shipping}, which passes (set "
        "validation.judge_all: true to judge every candidate)",
    )


def ruled_out(cand: Candidate, speed: dict[str, float] | None, why: str) -> dict[str, Any]:
    """The report entry, and the log line, of a candidate whose weights missed by far in
    another of their candidates (hf2triton.release.far)."""
    step_logger().info("validate: %s %s", cand.name, why)
    timed = {"throughput": speed} if speed else {}
    return bare_entry(cand, judged=False, status=why, **timed)


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
