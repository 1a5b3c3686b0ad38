"""Validate step for `task: text-classification`: the accuracy gate. Each candidate's labels and
probabilities are compared with the PyTorch model's on the validation set (label agreement,
largest absolute probability difference) and, when the spec gives a labelled set, its accuracy
against the gold labels; the first candidate that meets every threshold ships.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TypedDict

import numpy as np
from prefect import task

from hf2triton import classification, embeddings
from hf2triton.classification import ClassificationConfig, OnnxClassifier, TorchClassifier
from hf2triton.errors import AccuracyGateError
from hf2triton.spec import ClassificationSpec
from hf2triton.workspace import atomic_write_text, cached_step, digest, sha256_file, source_digest
from tasks.common import NO_PREFECT_CACHE, step_logger
from tasks.validate import Candidate, smoke_selection


class ClassificationValidation(TypedDict):
    chosen: str
    onnx_path: str
    metrics: dict[str, float]
    candidates: dict[str, dict[str, float]]
    sentences: int
    report_path: str
    reference_path: str  # smoke texts with PyTorch's and the shipped candidate's answers (json)
    smoke_texts: list[str]
    seconds: float
    reused: bool


def predicted(probs: np.ndarray, activation: str) -> np.ndarray:
    """Labels per text: the argmax, or for multi-label models the set above 0.5 (as a bitmask)."""
    if activation == "sigmoid":
        return (probs > 0.5).astype(np.int64) @ (1 << np.arange(probs.shape[1], dtype=np.int64))
    return probs.argmax(axis=1)


def gate_misses(metrics: dict[str, float], spec: ClassificationSpec) -> dict[str, float]:
    """How far each failing metric is from its threshold (empty when the gate passes)."""
    t = spec.thresholds
    out = {}
    if not metrics["label_agreement"] >= t.min_label_agreement:
        out["label_agreement"] = t.min_label_agreement - metrics["label_agreement"]
    if not metrics["max_prob_diff"] <= t.max_prob_diff:
        out["max_prob_diff"] = metrics["max_prob_diff"] - t.max_prob_diff
    if t.min_accuracy is not None and not metrics.get("accuracy", -1.0) >= t.min_accuracy:
        out["accuracy"] = t.min_accuracy - metrics.get("accuracy", float("nan"))
    return out


def validate_classification(
    model_dir: str,
    tokenizer_dir: str,
    candidates: list[Candidate],
    cfg: ClassificationConfig,
    sentences_path: str,
    spec: ClassificationSpec,
    smoke_count: int,
    work_root: str,
) -> ClassificationValidation:
    """Gate the candidates in order; return the first that passes, raise if none does."""
    sentences = embeddings.read_sentences(sentences_path)
    labelled = classification.read_labelled(spec.labelled, cfg.labels) if spec.labelled else None
    key = digest([
        "text-classification", [(c["name"], sha256_file(c["onnx_path"])) for c in candidates],
        sha256_file(sentences_path), sha256_file(spec.labelled) if spec.labelled else None,
        cfg.to_dict(), spec.model_dump(), smoke_count,
        source_digest(sys.modules[__name__], classification),
    ])
    started = time.perf_counter()
    failed_report = Path(work_root) / "validate" / f"failed-{key[:16]}.json"

    def build(out: Path) -> dict:
        from transformers import AutoTokenizer

        reference_model = TorchClassifier(model_dir, cfg)
        reference = reference_model.probs(sentences)
        ref_labels = predicted(reference, cfg.activation)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        report: dict = {"sentences": len(sentences), "thresholds": spec.thresholds.model_dump(),
                        "labels": cfg.labels, "candidates": []}
        if labelled:
            gold = np.array(labelled[1])
            report["pytorch_accuracy"] = float(
                (reference_model.probs(labelled[0]).argmax(axis=1) == gold).mean())
        chosen = None
        for n, cand in enumerate(candidates, 1):
            step_logger().info("validate: candidate %d of %d, %s: %d texts", n, len(candidates),
                               cand["name"], len(sentences))
            model = OnnxClassifier(cand["onnx_path"], tokenizer, cfg)
            probs = model.probs(sentences)
            diff = np.abs(probs - reference).max(axis=1)
            labels = predicted(probs, cfg.activation)
            metrics = {
                "label_agreement": float((labels == ref_labels).mean()),
                "max_prob_diff": float(diff.max()) if np.isfinite(diff).all() else float("inf"),
                "mean_prob_diff": float(diff.mean()),
            }
            if labelled:
                metrics["accuracy"] = float(
                    (model.probs(labelled[0]).argmax(axis=1) == gold).mean())
            worst = np.argsort(-diff)[:10]
            report["candidates"].append({
                "name": cand["name"], "metrics": metrics, "misses": gate_misses(metrics, spec),
                "disagreements": [sentences[i][:200] for i in np.flatnonzero(labels != ref_labels)][:20],
                "worst": [{"text": sentences[i][:200], "prob_diff": float(diff[i])} for i in worst],
            })
            if not gate_misses(metrics, spec):
                chosen = cand
                break
        report["chosen"] = chosen["name"] if chosen else None
        text = json.dumps(report, indent=1, ensure_ascii=False)
        if chosen is None:
            atomic_write_text(failed_report, text)
            raise AccuracyGateError(_gate_message(report, failed_report))
        atomic_write_text(out / "validation_report.json", text)
        smoke = smoke_selection(sentences, smoke_count)
        shipped = OnnxClassifier(chosen["onnx_path"], tokenizer, cfg).probs(smoke)
        atomic_write_text(out / "reference.json", json.dumps({
            "task": "text-classification", "texts": smoke, "labels": cfg.labels,
            "activation": cfg.activation,
            "pytorch_probs": reference_model.probs(smoke).tolist(),
            "candidate_probs": shipped.tolist(),
            "thresholds": spec.thresholds.model_dump(),
        }, ensure_ascii=False))
        return {
            "chosen": chosen["name"], "onnx_path": chosen["onnx_path"],
            "metrics": report["candidates"][-1]["metrics"],
            "candidates": {c["name"]: c["metrics"] for c in report["candidates"]},
            "sentences": len(sentences), "smoke_texts": smoke,
        }

    done = cached_step(work_root, "validate", key, build)
    return ClassificationValidation(
        **done.result,
        report_path=str(done.path / "validation_report.json"),
        reference_path=str(done.path / "reference.json"),
        seconds=round(time.perf_counter() - started, 3),
        reused=done.reused,
    )


def _gate_message(report: dict, path: Path) -> str:
    parts = []
    for cand in report["candidates"]:
        m = cand["metrics"]
        missed = ", ".join(f"{k} {m.get(k, float('nan')):.4f} (off by {gap:.4f})"
                           for k, gap in cand["misses"].items())
        parts.append(f"{cand['name']}: {missed}")
    return (
        f"accuracy gate failed on {report['sentences']} validation texts (thresholds "
        f"{report['thresholds']}): " + " | ".join(parts)
        + f". Nothing was registered or deployed. Full report: {path}. Relax "
        "classification.thresholds only if these figures are acceptable for your use."
    )


validate_classifier = task(validate_classification, name="validate", **NO_PREFECT_CACHE)
