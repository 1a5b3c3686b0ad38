"""Validate step: the accuracy gate. Compares each candidate ONNX model with the original PyTorch
model on the validation set and ships the first candidate that meets every threshold; when none
does, it fails with a report saying which metric missed by how much.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TypedDict

import numpy as np
from prefect import task
from scipy.stats import spearmanr

from hf2triton import embeddings
from hf2triton.embeddings import EmbeddingConfig, OnnxEmbedder, TorchEmbedder, cosine_rows
from hf2triton.errors import AccuracyGateError
from hf2triton.spec import Thresholds
from hf2triton.workspace import atomic_write_text, cached_step, digest, sha256_file, source_digest
from tasks.common import NO_PREFECT_CACHE, in_prefect_run, step_logger
from tasks.report import publish_gate_failure


class Candidate(TypedDict):
    name: str  # e.g. "dynamic-int8/qint8/per-channel" or "fp32"
    onnx_path: str


class Metrics(TypedDict):
    min_cosine: float
    mean_cosine: float
    spearman: float


class ValidationResult(TypedDict):
    chosen: str
    onnx_path: str
    metrics: Metrics
    candidates: dict[str, Metrics]
    sentences: int
    report_path: str
    reference_path: str  # smoke sentences and their PyTorch embeddings (npz)
    smoke_texts: list[str]
    embedding_dim: int
    seconds: float
    reused: bool


def _pairwise(emb: np.ndarray) -> np.ndarray:
    sims = emb @ emb.T
    return sims[np.triu_indices(len(emb), k=1)]


def score(reference: np.ndarray, candidate: np.ndarray) -> tuple[Metrics, np.ndarray]:
    """Per-sentence cosine plus the Spearman correlation of all pairwise similarities."""
    cos = cosine_rows(reference, candidate)
    ref = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    cand = candidate / np.linalg.norm(candidate, axis=1, keepdims=True)
    rho = float(spearmanr(_pairwise(ref), _pairwise(cand)).statistic) if len(ref) > 2 else 1.0
    return Metrics(
        min_cosine=float(cos.min()), mean_cosine=float(cos.mean()), spearman=rho
    ), cos


def timing_sentences(sentences: list[str], n: int = 32) -> list[str]:
    """A batch of validation sentences of the median length: what timing is measured on."""
    by_length = sorted(sentences, key=len)
    mid = len(by_length) // 2
    batch = by_length[max(0, mid - n // 2): mid + n // 2]
    return (batch * n)[:n]


def throughput(model: OnnxEmbedder, batch: list[str], repeats: int = 3) -> dict[str, float]:
    """Sentences per second in-process at batch 1 and 32 (best of `repeats`, after a warm-up)."""
    figures = {}
    for size in (1, 32):
        part = batch[:size]
        model.embed(part, size)
        best = min(_timed(model, part, size) for _ in range(repeats))
        figures[f"batch_{size}"] = round(len(part) / best, 1)
    return figures


def _timed(model: OnnxEmbedder, part: list[str], size: int) -> float:
    started = time.perf_counter()
    reps = 8 if size == 1 else 1
    for _ in range(reps):
        model.embed(part, size)
    return (time.perf_counter() - started) / reps


def misses(metrics: Metrics, thresholds: Thresholds) -> dict[str, float]:
    """How far below its threshold each failing metric is (empty when the gate passes)."""
    limits = thresholds.model_dump()
    # `not >=` so a NaN metric (a broken graph) is a miss, never a pass.
    return {k: limits[k] - metrics[k] for k in limits if not metrics[k] >= limits[k]}


def smoke_selection(sentences: list[str], n: int) -> list[str]:
    """Spread the smoke set over the length range: shortest, longest and in between."""
    by_length = sorted(dict.fromkeys(sentences), key=len)
    if len(by_length) <= n:
        return by_length
    picks = np.linspace(0, len(by_length) - 1, n).round().astype(int)
    return [by_length[i] for i in dict.fromkeys(picks.tolist())]


def validate_candidates(
    model_dir: str,
    tokenizer_dir: str,
    candidates: list[Candidate],
    embedding: EmbeddingConfig,
    sentences_path: str,
    thresholds: Thresholds,
    smoke_count: int,
    work_root: str,
    select: str = "first",
) -> ValidationResult:
    """Gate the candidates; raise if none passes.

    select="first" ships the first candidate (in the given order) that passes; select="fastest"
    validates and times every candidate in-process on this machine and ships the fastest that
    passes (throughput at batch 32 on sentences of the validation set's median length).
    """
    sentences = embeddings.read_sentences(sentences_path)
    key = digest([
        [(c["name"], sha256_file(c["onnx_path"])) for c in candidates],
        sha256_file(sentences_path), embedding.to_dict(), thresholds.model_dump(), smoke_count,
        select, source_digest(sys.modules[__name__], embeddings),
    ])
    started = time.perf_counter()
    failed_report = Path(work_root) / "validate" / f"failed-{key[:16]}.json"

    def build(out: Path) -> dict:
        log = step_logger()
        log.info("validate: PyTorch reference embeddings of %d sentences (up to %d candidates "
                 "x %d sentences follow)", len(sentences), len(candidates), len(sentences))
        reference_model = TorchEmbedder(model_dir, embedding)
        reference = reference_model.embed(sentences)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        report = {
            "sentences": len(sentences), "thresholds": thresholds.model_dump(),
            "embedding": embedding.to_dict(), "candidates": [],
        }
        chosen = None
        timing_batch = timing_sentences(sentences)
        for n, cand in enumerate(candidates, 1):
            log.info("validate: candidate %d of %d, %s: %d sentences", n, len(candidates),
                     cand["name"], len(sentences))
            model = OnnxEmbedder(cand["onnx_path"], tokenizer, embedding)
            metrics, cos = score(reference, model.embed(sentences))
            worst = np.argsort(cos)[:10]
            entry = {
                "name": cand["name"], "metrics": metrics,
                "misses": misses(metrics, thresholds),
                "worst": [{"text": sentences[i][:200], "cosine": float(cos[i])} for i in worst],
            }
            if select == "fastest":
                entry["throughput"] = throughput(model, timing_batch)
            report["candidates"].append(entry)
            if not entry["misses"] and select == "first":
                chosen = cand
                break
        if select == "fastest":
            passing = [e for e in report["candidates"] if not e["misses"]]
            if passing:
                best = max(passing, key=lambda e: e["throughput"]["batch_32"])
                chosen = next(c for c in candidates if c["name"] == best["name"])
        report["chosen"] = chosen["name"] if chosen else None
        text = json.dumps(report, indent=1, ensure_ascii=False)
        if chosen is None:
            atomic_write_text(failed_report, text)
            message = _gate_message(report, failed_report)
            if in_prefect_run():
                publish_gate_failure(Path(work_root).name, report, message)
            raise AccuracyGateError(message)
        atomic_write_text(out / "validation_report.json", text)
        smoke = smoke_selection(sentences, smoke_count)
        np.savez(
            out / "reference.npz", texts=np.array(smoke, dtype=object),
            embeddings=reference_model.embed(smoke),
        )
        shipped = next(e for e in report["candidates"] if e["name"] == chosen["name"])
        return {
            "chosen": chosen["name"], "onnx_path": chosen["onnx_path"],
            "metrics": shipped["metrics"],
            "candidates": {c["name"]: {**c["metrics"], **{
                f"sentences_per_s_{k}": v for k, v in c.get("throughput", {}).items()}}
                for c in report["candidates"]},
            "sentences": len(sentences), "smoke_texts": smoke,
            "embedding_dim": int(reference.shape[1]),
        }

    done = cached_step(work_root, "validate", key, build)
    return ValidationResult(
        **done.result,
        report_path=str(done.path / "validation_report.json"),
        reference_path=str(done.path / "reference.npz"),
        seconds=round(time.perf_counter() - started, 3),
        reused=done.reused,
    )


def _gate_message(report: dict, path: Path) -> str:
    parts = []
    for cand in report["candidates"]:
        missed = ", ".join(
            f"{k} {cand['metrics'][k]:.4f} < {report['thresholds'][k]} (short by {gap:.4f})"
            for k, gap in cand["misses"].items()
        )
        worst = cand["worst"][0]
        parts.append(f"{cand['name']}: {missed}; worst sentence {worst['text'][:40]!r} "
                     f"at cosine {worst['cosine']:.4f}")
    closest = min(report["candidates"], key=lambda c: sum(c["misses"].values()))
    return (
        f"accuracy gate failed on {report['sentences']} validation sentences; closest: "
        f"{closest['name']}. "
        + " | ".join(parts)
        + f". Nothing was registered or deployed. Full report: {path}. Relax "
        "validation.thresholds only if these figures are acceptable for your use."
    )


validate = task(validate_candidates, name="validate",
                task_run_name="validate: gate, ship the {select} passing", **NO_PREFECT_CACHE)
