"""The accuracy gate, for every model kind: each candidate runs through the serving core (the code
Triton runs, hf2triton.serving) in-process, batched as Triton batches it, and is scored against
the original PyTorch model with the kind's metrics and limits. The first candidate that meets
every limit ships (or, with `select="fastest"`, the fastest that does); when none does, the
release stops with a report of which metric missed by how much.

"Batched as Triton batches it": outputs of dynamic int8 depend on what else is in the batch.
Each candidate is measured one request at a time, in dynamic batches of max_batch_size requests
in arrival order, and on the smoke test's own requests in the batches the smoke test sends; its
figures are the worst of these, so a gate that passes is a smoke test that passes.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from hf2triton import serving
from hf2triton.errors import AccuracyGateError
from hf2triton.kinds.base import (
    Candidate,
    Data,
    ModelKind,
    describe_misses,
    misses,
    take,
    timing_items,
    to_json,
    worst_of,
)
from hf2triton.release.champion import Champion, champion_limit, mlflow_verdict
from hf2triton.release.report import publish_gate_failure
from hf2triton.util.cpu import cpu_features
from hf2triton.util.runs import in_prefect_run, step_logger
from hf2triton.util.workspace import atomic_write_text, cached_step, digest, hash_files, sha256_file

SERVING_DIR = Path(serving.__file__).parent


class GateResult(TypedDict):
    chosen: str
    champion: dict[str, Any]  # with labelled data: the champion's and the shipped candidate's
    #                           task metric ({} without labelled data)
    onnx_path: str  # the shipped candidate: a file, or a directory of files
    runtime: dict[str, Any] | None  # serving.json's runtime of the shipped candidate
    metrics: dict[str, float]
    candidates: dict[str, dict[str, float]]  # every measured candidate's figures
    items: int
    report_path: str
    reference_path: str  # the smoke test's items, PyTorch's answers and limits (json)
    info: dict[str, Any]  # what the repository needs from the reference (embedding_dim)
    seconds: float
    reused: bool


def candidate_digest(kind: ModelKind, candidate: str, export_dir: str) -> dict[str, str]:
    return {n: sha256_file(p) for n, p in kind.version_files(candidate, export_dir).items()}


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


# serving.json keys that tune speed, not answers (the configuration search may set them).
SPEED_SETTINGS = ("intra_op_threads", "max_batch_tokens")


def serves(champion: Champion, files: dict[str, str], settings: dict[str, Any]) -> bool:
    """Whether the champion is this candidate: its version directory holds exactly these files
    and its serving.json the same answer-shaping settings."""
    if any(champion["files"].get(name) != sha for name, sha in files.items()):
        return False
    return {k: v for k, v in champion["settings"].items() if k not in SPEED_SETTINGS} == {
        k: v for k, v in to_json(settings).items() if k not in SPEED_SETTINGS
    }


def score_champion(
    kind: ModelKind, champion: Champion, requests: list, data: Data, cfg: Any, batch: int
) -> float:
    """The champion's task metric, from its own served files and serving.json, through the
    serving core (a champion released before serving.json named its class: the kind's), and
    the labels alone: its outputs may have other sizes than the candidate's PyTorch reference."""
    module, cls = kind.serving
    model = serving.load(
        champion["version_dir"], {"module": module, "class": cls, **champion["settings"]}
    )
    outputs = kind.extract(answer_in_batches(model, requests, batch))
    return kind.labelled_scores(outputs, data, cfg)[kind.quality_metric]


@dataclass(frozen=True)
class Gate:
    """One release's gate, settled before anything runs: what every candidate is measured on,
    batched how, against which limits, and how the winner is picked."""

    kind: ModelKind
    cfg: Any
    data: Data  # the validation data as read (the smoke test's items come from it)
    gate_data: Data  # what the gate measures (labelled items added by some kinds)
    export_dir: str
    batch: int  # the largest dynamic batch Triton forms (deploy.max_batch_size)
    select: str  # "first" or "fastest" that passes
    judge_all: bool  # judge every candidate's accuracy, not only until the one that ships
    max_drop: float
    limits: dict[str, Any]
    smoke_limits: dict[str, Any]
    smoke_index: list[int]
    base: dict[str, Any]  # serving.json without file locations
    quality: str | None  # the task metric compared with the champion, when the data has labels

    @classmethod
    def of(
        cls,
        kind: ModelKind,
        cfg: Any,
        data: Data,
        export_dir: str,
        batch: int,
        max_batch_tokens: int,
        select: str,
        max_drop: float,
        judge_all: bool = False,
    ) -> Gate:
        gate_data = kind.gate_data(data, cfg)
        quality = (
            kind.quality_metric if kind.quality_metric in kind.labelled_metrics(gate_data) else None
        )
        return cls(
            kind,
            cfg,
            data,
            gate_data,
            export_dir,
            batch,
            select,
            judge_all,
            max_drop,
            kind.limits(),
            kind.smoke_limits(),
            kind.smoke_indices(data),
            kind.serving_json(cfg, export_dir, max_batch_tokens=max_batch_tokens),
            quality,
        )


@dataclass
class Reference:
    """PyTorch's answers the candidates are scored against, and the requests that ask for them:
    the gate's items, and the smoke test's."""

    outputs: Any
    requests: list[dict[str, np.ndarray]]
    smoke_data: Data
    smoke_outputs: Any
    smoke_requests: list[dict[str, np.ndarray]]


def run_gate(
    kind: ModelKind,
    model_dir: str,
    export_dir: str,
    candidates: list[Candidate],
    cfg: Any,
    data: Data,
    batch: int,
    max_batch_tokens: int,
    work_root: str,
    select: str = "first",
    champion: Champion | None = None,
    max_drop: float = 0.0,
    not_offered: dict[str, str] | None = None,
    judge_all: bool = False,
) -> GateResult:
    """Gate `candidates` against PyTorch, and with labelled data against the serving
    `champion`; raise AccuracyGateError if none passes. With `select` "first" they are judged
    in order and the first that passes ships; with "fastest" each is first timed with a short
    probe, then judged in order of speed, and the first that passes (the fastest that does)
    ships; `judge_all` judges the rest too, for the report.

    `batch` is the largest dynamic batch Triton forms (deploy.max_batch_size); `not_offered`
    the runtimes and precisions this machine could not try, with why (for the report)."""
    gate = Gate.of(
        kind, cfg, data, export_dir, batch, max_batch_tokens, select, max_drop, judge_all
    )
    digests = [
        (
            c.name,
            candidate_digest(kind, c.onnx_path, export_dir) if not c.error else c.error,
            c.runtime,
            c.gate_runtime,
        )
        for c in candidates
    ]
    # The step's result names the shipped files by path: a candidate rebuilt elsewhere with the
    # same bytes must not reuse a result that points at the old place.
    paths = [c.onnx_path for c in candidates]
    log = step_logger()
    same = champion_serves(gate, champion, digests)
    if same:
        log.info(
            "validate: the serving champion, version %s, serves the same files as %s: "
            "it is not compared with itself",
            champion["version"],
            ", ".join(sorted(same)),
        )
    key = digest([gate_key(gate, digests, champion, same, not_offered), paths])
    started = time.perf_counter()
    failed_report = Path(work_root) / "validate" / f"failed-{key[:16]}.json"

    def build(out: Path) -> dict:
        log.info(
            "validate: PyTorch reference on %d %s; then %d candidates%s, each judged one "
            "request at a time and in batches of %d",
            len(gate.gate_data),
            kind.item_word,
            len(candidates),
            ", timed first and judged fastest first until one passes"
            if select == "fastest" and not judge_all
            else "",
            batch,
        )
        ref = pytorch_reference(gate, model_dir)
        report = new_report(gate)
        report["not_offered"] = dict(not_offered or {})
        for what, why in report["not_offered"].items():
            log.info("validate: %s is not offered on this machine (%s): not tried", what, why)
        floor = face_champion(gate, champion, same, len(candidates), ref, report)
        order, speeds = candidates, {}
        if select == "fastest":
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
                kind.item_word,
            )
            entry = measure_candidate(gate, cand, ref, report.get("champion", {}), floor, same)
            if cand.name in speeds:
                entry["throughput"] = speeds[cand.name]
            report["candidates"].append(entry)
            if not entry["misses"] and shipping is None:
                shipping = cand.name
                if select == "first" and not gate.judge_all:
                    break
        chosen = choose(gate, candidates, report["candidates"])
        report["chosen"] = chosen.name if chosen else None
        return write_report(gate, report, chosen, ref, out, failed_report, work_root)

    done = cached_step(work_root, "validate", key, build)
    return GateResult(
        **done.result,
        report_path=str(done.path / "validation_report.json"),
        reference_path=str(done.path / "reference.json"),
        seconds=round(time.perf_counter() - started, 3),
        reused=done.reused,
    )


def champion_serves(gate: Gate, champion: Champion | None, digests: list[tuple]) -> set[str]:
    """The candidates the champion already serves (same files, same runtime): not compared
    with themselves."""
    if not (champion and gate.quality):
        return set()
    return {
        name
        for name, files, runtime, _ in digests
        if isinstance(files, dict)
        and serves(
            champion,
            files,
            {
                **candidate_settings(gate.base, runtime),
                **gate.kind.file_settings({n: n for n in files}),
            },
        )
    }


def candidate_settings(base: dict[str, Any], runtime: dict[str, Any] | None) -> dict[str, Any]:
    """serving.json (without file locations) of a candidate on `runtime`."""
    return {**base, "runtime": runtime} if runtime else dict(base)


def gate_key(
    gate: Gate,
    digests: list[tuple],
    champion: Champion | None,
    same: set[str],
    not_offered: dict[str, str] | None = None,
) -> str:
    """The validate step's cache key: everything its verdict depends on. When the champion
    serves one of the candidates it stays out: nothing new registered, same gate, step reused."""
    kind = gate.kind
    return digest(
        [
            kind.name,
            digests,
            digest(to_json(gate.gate_data.items)),
            digest(to_json(gate.gate_data.extra)),
            gate.base,
            gate.limits,
            gate.smoke_limits,
            gate.smoke_index,
            gate.batch,
            gate.select,
            gate.max_drop,
            gate.judge_all,
            gate.quality,
            not_offered or {},
            [champion["version"], champion["files"]]
            if champion and gate.quality and not same
            else None,
            [
                sha256_file(m.__file__)
                for m in (
                    sys.modules[__name__],
                    sys.modules[type(kind).__module__],
                    sys.modules[ModelKind.__module__],
                )
            ],
            hash_files(SERVING_DIR),
        ]
    )


def pytorch_reference(gate: Gate, model_dir: str) -> Reference:
    """PyTorch's answers on the gate's items, and the smoke test's share of them."""
    kind = gate.kind
    outputs = kind.reference(model_dir, gate.cfg, gate.gate_data)
    smoke_data = Data(take(gate.data.items, gate.smoke_index))
    return Reference(
        outputs=outputs,
        requests=kind.requests(gate.gate_data.items),
        smoke_data=smoke_data,
        smoke_outputs=take(outputs, gate.smoke_index),
        smoke_requests=kind.requests(smoke_data.items),
    )


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


def face_champion(
    gate: Gate,
    champion: Champion | None,
    same: set[str],
    n_candidates: int,
    ref: Reference,
    report: dict[str, Any],
) -> dict[str, Any]:
    """Score the serving champion (with labelled data) into `report["champion"]`; returns the
    floor a candidate's task metric must reach ({} when there is none to reach)."""
    quality, log = gate.quality, step_logger()
    if not quality:
        return {}
    if champion and len(same) == n_candidates:
        report["champion"] = {
            "version": champion["version"],
            "metric": quality,
            "status": f"the serving champion (version {champion['version']}) is this model",
        }
        return {}
    if not champion:
        report["champion"] = {
            "version": None,
            "metric": quality,
            "status": "first release: no champion to compare with",
        }
        log.info("validate: no serving champion yet: %s is reported, not compared", quality)
        return {}
    value = score_champion(gate.kind, champion, ref.requests, gate.gate_data, gate.cfg, gate.batch)
    floor = champion_limit(quality, value, gate.max_drop)
    report["champion"] = {
        "version": champion["version"],
        "metric": quality,
        "value": value,
        "max_drop": gate.max_drop,
        "floor": floor[quality][1],
    }
    log.info(
        "validate: the serving champion, version %s: %s %.4f (a candidate needs >= %.4f)",
        champion["version"],
        quality,
        value,
        floor[quality][1],
    )
    return floor


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
