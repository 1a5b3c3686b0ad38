"""Text classification the way the model defines it (labels from id2label, softmax or sigmoid),
computed by PyTorch (the reference) and by ONNX Runtime (the candidate)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hf2triton.embeddings import batched, resolve_embedding_config
from hf2triton.errors import SpecError, UnsupportedModelError


@dataclass(frozen=True)
class ClassificationConfig:
    """What serving needs to turn logits into labels; written to the served serving.json."""

    labels: list[str]  # index i is id2label[i]
    max_length: int
    activation: str  # "softmax" (single label) or "sigmoid" (multi-label)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_classification_config(model_dir: str | Path,
                                  max_length: int | None = None) -> ClassificationConfig:
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    id2label = config.get("id2label")
    if not id2label:
        raise UnsupportedModelError(
            f"{model_dir}/config.json has no id2label: it is not a sequence-classification "
            "model, so task 'text-classification' cannot serve labels from it"
        )
    labels = [str(id2label[k]) for k in sorted(id2label, key=int)]
    multi = config.get("problem_type") == "multi_label_classification"
    return ClassificationConfig(
        labels=labels,
        max_length=resolve_embedding_config(model_dir, "mean", False, max_length).max_length,
        activation="sigmoid" if multi else "softmax",
    )


def activate(logits: np.ndarray, activation: str) -> np.ndarray:
    logits = logits.astype(np.float64)
    if activation == "sigmoid":
        return (1 / (1 + np.exp(-logits))).astype(np.float32)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def read_labelled(path: str | Path, labels: list[str]) -> tuple[list[str], list[int]]:
    """`text<TAB>label` lines; labels must be the model's (id2label) names."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"classification.labelled file {str(p)!r} cannot be read: {exc}") from None
    texts, gold = [], []
    index = {name: i for i, name in enumerate(labels)}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        text, sep, label = line.rpartition("\t")
        if not sep or label.strip() not in index:
            raise SpecError(
                f"classification.labelled {str(p)!r} line {n}: expected 'text<TAB>label' with a "
                f"label among {labels}, got {line[:80]!r}"
            )
        texts.append(text)
        gold.append(index[label.strip()])
    if not texts:
        raise SpecError(f"classification.labelled file {str(p)!r} holds no labelled texts")
    return texts, gold


class TorchClassifier:
    """The original PyTorch model: the reference."""

    def __init__(self, model_dir: str | Path, cfg: ClassificationConfig):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self._torch = torch
        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()

    def encode(self, texts: list[str]) -> dict[str, np.ndarray]:
        return self.tokenizer(texts, padding=True, truncation=True,
                              max_length=self.cfg.max_length, return_tensors="np")

    def logits(self, enc: dict[str, np.ndarray]) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            out = self.model(**{k: torch.from_numpy(v) for k, v in enc.items()})
        return out.logits.float().numpy()

    def probs(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        return np.concatenate([activate(self.logits(self.encode(c)), self.cfg.activation)
                               for c in batched(texts, batch_size)])


class OnnxClassifier:
    """An exported (maybe quantized) classification graph run by ONNX Runtime."""

    def __init__(self, onnx_path: str | Path, tokenizer: Any, cfg: ClassificationConfig):
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.tokenizer, self.cfg = tokenizer, cfg

    def logits(self, enc: dict[str, np.ndarray]) -> np.ndarray:
        feed = {k: v.astype(np.int64) for k, v in enc.items() if k in self.inputs}
        if "token_type_ids" in self.inputs and "token_type_ids" not in feed:
            feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
        return self.session.run(["logits"], feed)[0]

    def probs(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        parts = []
        for chunk in batched(texts, batch_size):
            enc = self.tokenizer(chunk, padding=True, truncation=True,
                                 max_length=self.cfg.max_length, return_tensors="np")
            parts.append(activate(self.logits(enc), self.cfg.activation))
        return np.concatenate(parts)


def compare_classification(model_dir: str, onnx_path: Path, cfg: ClassificationConfig,
                           sentences: list[str]) -> float:
    """Largest |ONNX - PyTorch| of the logits on `sentences`."""
    reference = TorchClassifier(model_dir, cfg)
    candidate = OnnxClassifier(onnx_path, reference.tokenizer, cfg)
    worst = 0.0
    for chunk in batched(sentences, 8):
        enc = reference.encode(chunk)
        diff = np.abs(reference.logits(enc) - candidate.logits(enc))
        if not np.isfinite(diff).all():
            return float("inf")
        worst = max(worst, float(diff.max()))
    return worst
