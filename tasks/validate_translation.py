"""Validate step for `task: translation`: the accuracy gate. Each candidate (a set of encoder,
decoder and decoder-with-past ONNX files) translates the validation set with the served decoder
(hf2triton.seq2seq, the code Triton runs) and the release's default decoding; its output is scored
with sacrebleu BLEU and chrF against PyTorch `generate`'s, and against reference translations when
the spec gives them. The first candidate that meets every threshold ships.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TypedDict

from prefect import task

from hf2triton import embeddings, seq2seq, translation
from hf2triton.embeddings import batched
from hf2triton.errors import AccuracyGateError, SpecError
from hf2triton.seq2seq import OrtSeq2Seq, Seq2SeqTokenizer
from hf2triton.spec import GenerationSpec
from hf2triton.translation import TOKENIZER_DIR, TorchTranslator, TranslationConfig, bleu_chrf
from hf2triton.workspace import atomic_write_text, cached_step, digest, sha256_file, source_digest
from tasks.common import NO_PREFECT_CACHE, step_logger
from tasks.validate import Candidate, smoke_selection


class TranslationValidation(TypedDict):
    chosen: str
    onnx_path: str  # directory of the shipped ONNX files
    metrics: dict[str, float]
    candidates: dict[str, dict[str, float]]
    sentences: int
    report_path: str
    reference_path: str  # smoke texts with PyTorch's and the shipped candidate's output (json)
    smoke_texts: list[str]
    seconds: float
    reused: bool


def _files_digest(directory: str) -> list[str]:
    return [sha256_file(p) for p in translation.serving_files(directory).values()]


def read_references(path: str, count: int) -> list[str]:
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"generation.references file {str(p)!r} cannot be read: {exc}") from None
    lines = [line for line in lines if line.strip()]
    if len(lines) != count:
        raise SpecError(
            f"generation.references {str(p)!r} has {len(lines)} translations for {count} "
            "validation sentences: give one per non-empty line of validation.sentences"
        )
    return lines


def gate_misses(metrics: dict[str, float], spec: GenerationSpec) -> dict[str, float]:
    t = spec.thresholds
    limits = {"bleu": t.min_bleu, "chrf": t.min_chrf, "reference_bleu": t.min_reference_bleu,
              "reference_chrf": t.min_reference_chrf}
    return {k: v - metrics.get(k, float("nan")) for k, v in limits.items()
            if v is not None and not metrics.get(k, float("nan")) >= v}


class CandidateTranslator:
    """A candidate's ONNX files run by the served decoder, with the served tokenizer."""

    def __init__(self, onnx_dir: str, export_dir: str, cfg: TranslationConfig):
        plan = json.loads((Path(export_dir) / TOKENIZER_DIR / "plan.json").read_text())
        self.tokenizer = Seq2SeqTokenizer(str(Path(export_dir) / TOKENIZER_DIR), plan,
                                          cfg.max_input_length)
        self.model = OrtSeq2Seq(translation.serving_files(onnx_dir))
        self.settings = cfg.settings

    def translate(self, texts: list[str], num_beams: int | None = None,
                  batch_size: int = 8) -> list[str]:
        s = self.settings.with_request(num_beams=num_beams)
        ids, _ = self.tokenizer.encode(texts)
        out = [g for chunk in batched(ids, batch_size)
               for g in self.model.generate(chunk, s, s.pad_token_id)]
        return self.tokenizer.decode(out)


def validate_translation(
    model_dir: str,
    export_dir: str,
    candidates: list[Candidate],
    cfg: TranslationConfig,
    sentences_path: str,
    spec: GenerationSpec,
    smoke_count: int,
    work_root: str,
) -> TranslationValidation:
    """Gate the candidates in order; return the first that passes, raise if none does."""
    sentences = embeddings.read_sentences(sentences_path)
    references = read_references(spec.references, len(sentences)) if spec.references else None
    key = digest([
        "translation", [(c["name"], _files_digest(c["onnx_path"])) for c in candidates],
        sha256_file(sentences_path), sha256_file(spec.references) if spec.references else None,
        sha256_file(Path(export_dir) / TOKENIZER_DIR / "plan.json"), cfg.to_dict(),
        spec.model_dump(), smoke_count,
        source_digest(sys.modules[__name__], translation, seq2seq),
    ])
    started = time.perf_counter()
    failed_report = Path(work_root) / "validate" / f"failed-{key[:16]}.json"

    def build(out: Path) -> dict:
        reference_model = TorchTranslator(model_dir, cfg)
        reference = reference_model.decode(reference_model.generate(sentences))
        report: dict = {
            "sentences": len(sentences), "thresholds": spec.thresholds.model_dump(),
            "decoding": cfg.decode, "candidates": [],
        }
        if references:
            bleu, chrf = bleu_chrf(reference, references)
            report["pytorch_vs_references"] = {"bleu": bleu, "chrf": chrf}
        chosen = None
        for n, cand in enumerate(candidates, 1):
            step_logger().info("validate: candidate %d of %d, %s: %d sentences", n, len(candidates),
                               cand["name"], len(sentences))
            hyp = CandidateTranslator(cand["onnx_path"], export_dir, cfg).translate(sentences)
            bleu, chrf = bleu_chrf(hyp, reference)
            same = [h == r for h, r in zip(hyp, reference)]
            metrics = {"bleu": bleu, "chrf": chrf, "exact_match": sum(same) / len(same)}
            if references:
                metrics["reference_bleu"], metrics["reference_chrf"] = bleu_chrf(hyp, references)
            report["candidates"].append({
                "name": cand["name"], "metrics": metrics, "misses": gate_misses(metrics, spec),
                "differ": [{"text": sentences[i][:200], "pytorch": reference[i][:200],
                            "candidate": hyp[i][:200]}
                           for i in range(len(same)) if not same[i]][:10],
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
        shipped = CandidateTranslator(chosen["onnx_path"], export_dir, cfg)
        atomic_write_text(out / "reference.json", json.dumps({
            "task": "translation", "texts": smoke,
            "pytorch_greedy": reference_model.decode(reference_model.generate(smoke, 1)),
            "candidate_greedy": shipped.translate(smoke, 1),
            "candidate_default": shipped.translate(smoke),
            "num_beams": cfg.settings.num_beams,
            "thresholds": spec.thresholds.model_dump(),
        }, ensure_ascii=False))
        return {
            "chosen": chosen["name"], "onnx_path": chosen["onnx_path"],
            "metrics": report["candidates"][-1]["metrics"],
            "candidates": {c["name"]: c["metrics"] for c in report["candidates"]},
            "sentences": len(sentences), "smoke_texts": smoke,
        }

    done = cached_step(work_root, "validate", key, build)
    return TranslationValidation(
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
        missed = ", ".join(f"{k} {m.get(k, float('nan')):.2f} < {gap + m.get(k, 0):.2f}"
                           for k, gap in cand["misses"].items())
        first = cand["differ"][0] if cand["differ"] else None
        parts.append(f"{cand['name']}: {missed}" + (
            f"; e.g. {first['text'][:40]!r} -> {first['candidate'][:40]!r}, PyTorch "
            f"{first['pytorch'][:40]!r}" if first else ""))
    return (
        f"accuracy gate failed on {report['sentences']} validation sentences: "
        + " | ".join(parts)
        + f". Nothing was registered or deployed. Full report: {path}. Relax "
        "generation.thresholds only if these figures are acceptable for your use."
    )


validate_translator = task(validate_translation, name="validate", **NO_PREFECT_CACHE)
