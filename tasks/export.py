"""Export step: optimum-onnx export with dynamic batch and sequence axes, then a check of the ONNX
graph against PyTorch on real tokenized sentences (not dummy inputs); a mismatch fails the step.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TypedDict

import numpy as np
from prefect import task

from hf2triton import classification, embeddings, seq2seq, translation
from hf2triton.classification import ClassificationConfig, compare_classification
from hf2triton.embeddings import EmbeddingConfig, OnnxEmbedder, TorchEmbedder, batched
from hf2triton.translation import TranslationConfig, compare_translation
from hf2triton.errors import ExportError, UnsupportedModelError
from hf2triton.workspace import cached_step, digest, source_digest
from tasks.common import NO_PREFECT_CACHE

ONNX_TASK = {
    "feature-extraction": "feature-extraction",
    "text-classification": "text-classification",
    # Encoder, decoder and decoder-with-past files: generation with a KV cache.
    "translation": "text2text-generation-with-past",
}
# The file whose absence means the export failed.
MAIN_FILE = {"translation": seq2seq.ONNX_FILES["encoder"]}


class ExportResult(TypedDict):
    onnx_path: str
    export_dir: str
    opset: int
    max_abs_diff: float
    checked_sentences: int
    seconds: float
    reused: bool


def _check_sentences(sentences: list[str], n: int = 24) -> list[str]:
    # The longest inputs exercise truncation and padding; the first ones are ordinary text.
    longest = sorted(sentences, key=len, reverse=True)[:4]
    return list(dict.fromkeys([*sentences[: n - len(longest)], *longest]))


def _export(model_dir: str, out: Path, task_name: str, opset: int) -> None:
    import torch
    from optimum.exporters.onnx import main_export

    from hf2triton import quiet

    # optimum-onnx 0.1.0 loads the model with `torch_dtype=float32`, which transformers 4.57
    # renamed to `dtype` and warns about; float32 is what we export either way.
    for source in ("transformers.modeling_utils", "transformers.configuration_utils"):
        quiet.drop_log_message(source, "`torch_dtype` is deprecated")
    try:
        # Tracing turns Python values computed from the example input into constants and warns
        # each time. A trace that froze a shape would disagree with PyTorch on the real sentences
        # of other lengths and batch sizes that every export is checked on below.
        with quiet.ignored_warnings(torch.jit.TracerWarning):
            main_export(
                model_dir, output=out, task=ONNX_TASK[task_name], opset=opset, device="cpu",
                # Token states out, not sentence-transformers' pooled output: serving pools.
                library_name="transformers",
                do_validation=False,  # replaced by our check on real sentences below
            )
    except (ValueError, KeyError, NotImplementedError) as exc:
        text = str(exc)
        if "not supported" in text or "unsupported" in text.lower() or isinstance(exc, KeyError):
            raise UnsupportedModelError(
                f"optimum-onnx cannot export this model for {task_name}: {text.splitlines()[0]}"
            ) from None
        raise ExportError(f"ONNX export of {model_dir} failed: {text}") from exc
    main = MAIN_FILE.get(task_name, "model.onnx")
    if not (out / main).is_file():
        raise ExportError(f"ONNX export of {model_dir} produced no {main} in {out}")


def compare_with_torch(
    model_dir: str, onnx_path: Path, cfg: EmbeddingConfig, sentences: list[str]
) -> float:
    """Largest |ONNX - PyTorch| over the real (unpadded) token states of `sentences`."""
    reference = TorchEmbedder(model_dir, cfg)
    candidate = OnnxEmbedder(onnx_path, reference.tokenizer, cfg)
    worst = 0.0
    for chunk in batched(sentences, 8):
        enc = reference.encode(chunk)
        mask = enc["attention_mask"].astype(bool)
        diff = np.abs(reference.hidden_states(enc) - candidate.hidden_states(enc))[mask]
        if not np.isfinite(diff).all():
            return float("inf")  # NaN/inf states: max() would silently skip them
        worst = max(worst, float(diff.max()))
    return worst


def export_onnx(
    model_dir: str,
    content_hash: str,
    task_name: str,
    opset: int,
    atol: float,
    embedding: EmbeddingConfig | ClassificationConfig | TranslationConfig,
    sentences: list[str],
    work_root: str,
) -> ExportResult:
    """Export `model_dir` to ONNX and prove it matches PyTorch within `atol`.

    `embedding` is the task's resolved config. For translation `onnx_path` is the export
    directory (encoder, decoder and decoder-with-past files) and the check also requires greedy
    ONNX Runtime generation to equal PyTorch `generate` token for token."""
    check = _check_sentences(sentences)
    key = digest([
        content_hash, task_name, opset, atol, embedding.to_dict(), check,
        source_digest(sys.modules[__name__], embeddings, classification, translation, seq2seq),
    ])
    started = time.perf_counter()

    def build(out: Path) -> dict:
        _export(model_dir, out, task_name, opset)
        if isinstance(embedding, TranslationConfig):
            return _check_translation(model_dir, out, embedding, check, atol)
        # The served model tokenizes with the `tokenizers` library, so tokenizer.json must exist.
        if not (out / "tokenizer.json").is_file():
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(model_dir, use_fast=True).save_pretrained(out)
        if not (out / "tokenizer.json").is_file():
            raise ExportError(
                f"{model_dir} has no fast tokenizer, which serving needs (tokenizer.json)"
            )
        compare = (compare_classification if isinstance(embedding, ClassificationConfig)
                   else compare_with_torch)
        worst = compare(model_dir, out / "model.onnx", embedding, check)
        if not worst <= atol:
            raise ExportError(
                f"the ONNX export disagrees with PyTorch: largest difference of hidden states "
                f"{worst:.2e} > export.atol {atol:.0e} on {len(check)} real sentences; try "
                "another export.opset or report the model"
            )
        return {"max_abs_diff": worst, "checked_sentences": len(check)}

    done = cached_step(work_root, "export", key, build)
    return ExportResult(
        onnx_path=str(done.path if task_name == "translation" else done.path / "model.onnx"),
        export_dir=str(done.path),
        opset=opset,
        max_abs_diff=done.result["max_abs_diff"],
        checked_sentences=done.result["checked_sentences"],
        seconds=round(time.perf_counter() - started, 3),
        reused=done.reused,
    )


def _check_translation(model_dir: str, out: Path, cfg: TranslationConfig, check: list[str],
                       atol: float) -> dict:
    import json

    plan = translation.write_serving_tokenizer(model_dir, out / translation.TOKENIZER_DIR,
                                               cfg.source_lang)
    (out / translation.TOKENIZER_DIR / "plan.json").write_text(json.dumps(plan, indent=1))
    found = compare_translation(model_dir, out, cfg, check)
    if not found["max_abs_diff"] <= atol:
        raise ExportError(
            f"the ONNX encoder disagrees with PyTorch: largest difference of hidden states "
            f"{found['max_abs_diff']:.2e} > export.atol {atol:.0e} on {len(check)} real "
            "sentences; try another export.opset or report the model"
        )
    if found["greedy_mismatches"]:
        raise ExportError(
            f"greedy generation with the fp32 ONNX files differs from PyTorch generate on "
            f"{found['greedy_mismatches']} of {len(check)} sentences (first: "
            f"{found['first_mismatch'][:40]!r}); try another export.opset or report the model"
        )
    return {"max_abs_diff": found["max_abs_diff"], "checked_sentences": len(check)}


export = task(export_onnx, name="export", **NO_PREFECT_CACHE)
