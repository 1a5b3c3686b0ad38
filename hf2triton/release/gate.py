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
from pathlib import Path
from typing import Any, TypedDict, cast

import numpy as np

from hf2triton import kinds, runtimes, serving
from hf2triton.kinds import margin
from hf2triton.kinds.base import Candidate, Data, ModelKind, take, to_json
from hf2triton.kinds.config import KindConfig
from hf2triton.release import judge, verdict
from hf2triton.release.champion import Champion, champion_limit
from hf2triton.release.export import export_space
from hf2triton.release.judge import answer_in_batches, judge_candidates
from hf2triton.release.plan import Facing, Gate, GateSettings, Reference, candidate_settings
from hf2triton.release.verdict import Written, new_report, write_report
from hf2triton.targets import smoke
from hf2triton.util.isolated import run_isolated
from hf2triton.util.runs import step_logger
from hf2triton.util.workspace import (
    atomic_write_text,
    cached_step,
    digest,
    hash_files,
    sha256_file,
    sha256_module,
)

SERVING_DIR = Path(serving.__file__).parent
RUNTIMES_DIR = Path(runtimes.__file__).parent
KINDS_DIR = Path(kinds.__file__).parent

__all__ = ["GateResult", "GateSettings", "answer_in_batches", "run_gate"]

# serving.json keys that tune speed, not answers (the configuration search may set them).
SPEED_SETTINGS = ("intra_op_threads", "max_batch_tokens")


class GateResult(TypedDict):
    chosen: str
    champion: dict[str, Any]  # with labelled data: the champion's and the shipped candidate's
    #                           task metric ({} without labelled data)
    onnx_path: str  # the shipped candidate: a file, or a directory of files
    runtime: dict[str, Any] | None  # serving.json's runtime of the shipped candidate
    metrics: dict[str, float]
    candidates: dict[str, dict[str, float]]  # every measured candidate's figures
    items: int
    built: list[str]  # the graphs the gate built itself (planned variants), shipped or not
    report_path: str
    reference_path: str  # the smoke test's items, PyTorch's answers and limits (json)
    info: dict[str, Any]  # what the repository needs from the reference (embedding_dim)
    seconds: float
    reused: bool


def candidate_digest(
    kind: ModelKind[KindConfig], candidate: str, export_dir: str
) -> dict[str, str]:
    return {n: sha256_file(p) for n, p in kind.version_files(candidate, export_dir).items()}


def candidate_digests(gate: Gate, candidates: list[Candidate]) -> list[Digest]:
    """Each candidate's digest: its files' sha256, or why it could not be built, or (planned)
    what builds it: the runtimes' code (hf2triton/runtimes), from graphs whose bytes the key
    holds (the export, each runtime's first variant)."""
    planned = (
        f"planned: built by {digest(hash_files(RUNTIMES_DIR))}"
        if any(c.planned for c in candidates)
        else ""
    )
    return [
        (
            c.name,
            c.error or planned
            if c.error or c.planned
            else candidate_digest(gate.kind, c.onnx_path, gate.export_dir),
            c.runtime,
            c.gate_runtime,
        )
        for c in candidates
    ]


def serves(champion: Champion, files: dict[str, str], settings: dict[str, Any]) -> bool:
    """Whether the champion is this candidate: its version directory holds exactly these files
    and its serving.json the same answer-shaping settings."""
    if any(champion["files"].get(name) != sha for name, sha in files.items()):
        return False
    return {k: v for k, v in champion["settings"].items() if k not in SPEED_SETTINGS} == {
        k: v for k, v in to_json(settings).items() if k not in SPEED_SETTINGS
    }


def score_champion(
    kind: ModelKind[KindConfig],
    champion: Champion,
    requests: list[dict[str, np.ndarray]],
    data: Data,
    cfg: KindConfig,
    batch: int,
) -> float:
    """The champion's task metric, from its own served files and serving.json, through the
    serving core (a champion released before serving.json named its class: the kind's), and
    the labels alone: its outputs may have other sizes than the candidate's PyTorch reference."""
    module, cls = kind.serving
    model = serving.load(
        champion["version_dir"], {"module": module, "class": cls, **champion["settings"]}
    )
    outputs = kind.extract(answer_in_batches(model, requests, batch))
    metric = kind.quality_metric
    assert metric is not None  # a champion is scored on the kind's task metric only
    return kind.labelled_scores(outputs, data, cfg)[metric]


def run_gate(
    gate: Gate,
    candidates: list[Candidate],
    *,
    model_dir: str,
    work_root: str,
    champion: Champion | None = None,
) -> GateResult:
    """Gate `candidates` (graphs of the export `gate` names) against the PyTorch model in
    `model_dir` on the gate's data, and with labelled data against the serving `champion`;
    raise AccuracyGateError if none passes. How they are judged and picked: the `gate`
    (hf2triton.release.plan.Gate.of, from the release's GateSettings)."""
    digests = candidate_digests(gate, candidates)
    # The step's result names the shipped files by path: a candidate rebuilt elsewhere with the
    # same bytes must not reuse a result that points at the old place. Paths inside the work root
    # count relative to it: a work directory copied or moved whole (another home) keeps its
    # finished gate.
    paths = [in_work(c.onnx_path, work_root) for c in candidates]
    same = champion_serves(gate, champion, digests)
    if same and champion:
        step_logger().info(
            "validate: the serving champion, version %s, serves the same files as %s: "
            "it is not compared with itself",
            champion["version"],
            ", ".join(sorted(same)),
        )
    key = digest([gate_key(gate, digests, champion, same), paths])
    started = time.perf_counter()
    failed_report = Path(work_root) / "validate" / f"failed-{key[:16]}.json"

    def build(out: Path) -> dict[str, Any]:
        ref, report, chosen = decide(gate, candidates, model_dir, champion, same, work_root)
        result = write_report(gate, report, chosen, ref, Written(out, failed_report, work_root))
        return {
            **result,
            "onnx_path": in_work(result["onnx_path"], work_root),
            "built": [in_work(p, work_root) for p in result["built"]],
        }

    done = cached_step(work_root, "validate", key, build)
    # The step's JSON result holds the keys write_report returned, the rest are added here.
    return cast(
        GateResult,
        {
            **done.result,
            "onnx_path": str(Path(work_root) / done.result["onnx_path"]),
            "built": [str(Path(work_root) / p) for p in done.result.get("built", [])],
            "report_path": str(done.path / "validation_report.json"),
            "reference_path": str(done.path / "reference.json"),
            "seconds": round(time.perf_counter() - started, 3),
            "reused": done.reused,
        },
    )


def decide(
    gate: Gate,
    candidates: list[Candidate],
    model_dir: str,
    champion: Champion | None,
    same: set[str],
    work_root: str,
) -> tuple[Reference, dict[str, Any], Candidate | None]:
    """PyTorch's reference, the champion faced, and the candidates judged: the report so far
    and the candidate that ships (None: none passed)."""
    log = step_logger()
    log.info(
        "validate: PyTorch reference on %s %s; then %d candidates%s, each judged one "
        "request at a time and in batches of %d",
        gate.sized,
        gate.kind.item_word,
        len(candidates),
        ", timed first and judged fastest first until one passes"
        if gate.select == "fastest" and not gate.judge_all
        else "",
        gate.batch,
    )
    ref = pytorch_reference(gate, model_dir, work_root)
    report = new_report(gate)
    report["not_offered"] = dict(gate.not_offered)
    for what, why in report["not_offered"].items():
        log.info("validate: %s not tried: %s", what, why)
    floor = face_champion(gate, champion, same, len(candidates), ref, report)
    facing = Facing(report.get("champion", {}), floor, frozenset(same))
    chosen = judge_candidates(gate, candidates, ref, report, facing)
    # On every item PyTorch answered (a sampled kind's looks have grown it by now).
    own = gate.kind.pytorch_scores(ref.outputs, gate.items(len(ref.outputs)), gate.cfg)
    if own:
        report["pytorch"] = own
        log.info(
            "validate: PyTorch's own answers: %s", ", ".join(f"{k} {v:.4f}" for k, v in own.items())
        )
    report["chosen"] = chosen.name if chosen else None
    return ref, report, chosen


def in_work(path: str, work_root: str) -> str:
    """`path` relative to the work root when it lies there (a step's output), else as given
    (Path joins either back onto the work root)."""
    try:
        return Path(path).relative_to(work_root).as_posix()
    except ValueError:
        return path


# A candidate's digest: its name, its files' sha256 (or why it could not be built), the runtime
# serving.json names and the runtime the gate runs it on.
Digest = tuple[str, dict[str, str] | str, dict[str, Any] | None, dict[str, Any] | None]


def champion_serves(gate: Gate, champion: Champion | None, digests: list[Digest]) -> set[str]:
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


def gate_key(gate: Gate, digests: list[Digest], champion: Champion | None, same: set[str]) -> str:
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
            gate.smoke_index,
            gate.batch,
            gate.select,
            gate.max_drop,
            gate.judge_all,
            [gate.objective, gate.prune, list(gate.looks)],
            gate.quality,
            dict(gate.not_offered),
            [champion["version"], champion["files"]]
            if champion and gate.quality and not same
            else None,
            [
                sha256_module(m)
                for m in (
                    sys.modules[__name__],
                    judge,
                    verdict,
                    margin,
                    smoke,
                    sys.modules[type(kind).__module__],
                    sys.modules[ModelKind.__module__],
                )
            ],
            hash_files(SERVING_DIR),
        ]
    )


def pytorch_reference(gate: Gate, model_dir: str, work_root: str | None = None) -> Reference:
    """PyTorch's answers on the gate's first look's items (every item, unless the kind sizes
    its sample: `Gate.looks`; `Reference.upto` computes the rest when a look needs them), and
    the smoke test's share of them; with a work root computed once per model, data and kind
    (`reference_outputs`)."""
    kind, first = gate.kind, (gate.looks or (len(gate.gate_data),))[0]

    def answers(start: int, stop: int) -> Any:
        if work_root:
            return reference_outputs(gate, model_dir, work_root, start, stop)
        return kind.reference(model_dir, gate.cfg, gate.gate_data.part(start, stop))

    def more(start: int, stop: int) -> tuple[list[Any], list[dict[str, np.ndarray]]]:
        step_logger().info(
            "validate: PyTorch reference on %d more %s (%d to %d): the bounds on the first %d "
            "left the verdict open",
            stop - start,
            kind.item_word,
            start + 1,
            stop,
            start,
        )
        outputs = list(answers(start, stop))
        return outputs, kind.judging_requests(gate.gate_data.items[start:stop], outputs)

    outputs = answers(0, first)
    smoke_data = Data(take(gate.data.items, gate.smoke_index))
    return Reference(
        outputs=outputs,
        requests=kind.judging_requests(gate.gate_data.items[:first], outputs),
        smoke_data=smoke_data,
        smoke_outputs=take(outputs, gate.smoke_index),
        smoke_requests=kind.requests(smoke_data.items),
        more=more if first < len(gate.gate_data) else None,
    )


def write_reference(
    kind: ModelKind[Any], model_dir: str, cfg: KindConfig, data: Data, out: Path
) -> None:
    """PyTorch's answers on `data`'s items, into `out`/reference.json."""
    outputs = kind.reference(model_dir, cfg, data)
    atomic_write_text(out / "reference.json", json.dumps(to_json(outputs)))


def reference_outputs(
    gate: Gate, model_dir: str, work_root: str, start: int = 0, stop: int | None = None
) -> Any:
    """PyTorch's answers on the gate's items [start, stop) (all of them by default), kept in
    the work folder (step `reference`, keyed by the model's files, the kind's settings, the
    items and the kinds' code): a gate run again with other candidates or limits (a threshold
    relaxed after a refusal) reads them back instead of running the model again, minutes on a
    large one. Read back through JSON on the first run too, so both runs score the same
    values."""
    import torch

    kind = gate.kind
    data = gate.gate_data.part(start, len(gate.gate_data) if stop is None else stop)
    key = digest(
        [
            kind.name,
            hash_files(model_dir),
            gate.cfg.to_dict(),
            digest(to_json(data.items)),
            digest(to_json(data.extra)),
            hash_files(KINDS_DIR),
            torch.__version__,
        ]
    )

    def build(out: Path) -> dict[str, Any]:
        # In a process of its own for a large model: PyTorch's copy of the weights and its
        # activations are returned to the system when it ends (hf2triton.util.isolated).
        size = export_space(kind, model_dir).size
        run_isolated(
            "PyTorch reference", size, write_reference, kind, model_dir, gate.cfg, data, out
        )
        return {}

    done = cached_step(work_root, "reference", key, build)
    if done.reused:
        step_logger().info("validate: PyTorch's answers read back from %s", done.path)
    return kind.from_json(json.loads((done.path / "reference.json").read_text()))


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
