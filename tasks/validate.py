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
from tasks.common import NO_PREFECT_CACHE, in_prefect_run
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
) -> ValidationResult:
    """Gate the candidates in order; return the first that passes, raise if none does."""
    sentences = embeddings.read_sentences(sentences_path)
    key = digest([
        [(c["name"], sha256_file(c["onnx_path"])) for c in candidates],
        sha256_file(sentences_path), embedding.to_dict(), thresholds.model_dump(), smoke_count,
        source_digest(sys.modules[__name__], embeddings),
    ])
    started = time.perf_counter()
    failed_report = Path(work_root) / "validate" / f"failed-{key[:16]}.json"

    def build(out: Path) -> dict:
        reference_model = TorchEmbedder(model_dir, embedding)
        reference = reference_model.embed(sentences)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        report = {
            "sentences": len(sentences), "thresholds": thresholds.model_dump(),
            "embedding": embedding.to_dict(), "candidates": [],
        }
        chosen = None
        for cand in candidates:
            emb = OnnxEmbedder(cand["onnx_path"], tokenizer, embedding).embed(sentences)
            metrics, cos = score(reference, emb)
            worst = np.argsort(cos)[:10]
            report["candidates"].append({
                "name": cand["name"], "metrics": metrics,
                "misses": misses(metrics, thresholds),
                "worst": [{"text": sentences[i][:200], "cosine": float(cos[i])} for i in worst],
            })
            if not misses(metrics, thresholds):
                chosen = cand
                break
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
        return {
            "chosen": chosen["name"], "onnx_path": chosen["onnx_path"],
            "metrics": report["candidates"][-1]["metrics"],
            "candidates": {c["name"]: c["metrics"] for c in report["candidates"]},
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
    return (
        f"accuracy gate failed on {report['sentences']} validation sentences: "
        + " | ".join(parts)
        + f". Nothing was registered or deployed. Full report: {path}. Relax "
        "validation.thresholds only if these figures are acceptable for your use."
    )


validate = task(validate_candidates, name="validate", **NO_PREFECT_CACHE)
