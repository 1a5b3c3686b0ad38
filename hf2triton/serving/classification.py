"""Served text classification: TEXT [batch, 1] in; LABEL [batch, 1] (id2label's name, or for a
multi-label model the labels above 0.5 joined by ','), SCORES [batch, labels] (softmax, or
sigmoid for multi-label models) and TRUNCATED [batch, 1] out."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import TEXT, TRUNCATED, Tensor, text_column
from .text import TextModel, truncated


def activate(logits: np.ndarray, activation: str) -> np.ndarray:
    logits = logits.astype(np.float64)
    if activation == "sigmoid":
        return (1 / (1 + np.exp(-logits))).astype(np.float32)
    if activation == "softmax":
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    raise ValueError(f"unknown activation {activation!r}")


def label_names(scores: np.ndarray, labels: list[str], activation: str) -> list[str]:
    if activation == "sigmoid":
        return [",".join(labels[j] for j in np.flatnonzero(row > 0.5)) for row in scores]
    return [labels[j] for j in scores.argmax(axis=1)]


class Classifier(TextModel):
    inputs = (TEXT,)
    outputs = (Tensor("LABEL", "STRING"), Tensor("SCORES", "FP32", ("num_labels",)), TRUNCATED)

    def __init__(self, onnx_path: str, tokenizer_path: str, settings: dict[str, Any]):
        self.labels = [str(x) for x in settings["labels"]]
        self.activation = settings["activation"]
        activate(np.zeros((1, 1)), self.activation)  # an unknown activation fails at load
        super().__init__(onnx_path, tokenizer_path, settings)

    def parse(self, arrays: dict[str, np.ndarray]) -> list[str]:
        return text_column(arrays)

    def probabilities(self, encodings: list[Any]) -> list[np.ndarray]:
        return self.text.forward(
            encodings, ["logits"], lambda out, mask: activate(out["logits"], self.activation)
        )

    def run(self, rows: list[str]) -> dict[str, list[np.ndarray]]:
        encodings = self.text.encode(rows)
        scores = self.probabilities(encodings)
        names = label_names(np.stack(scores), self.labels, self.activation)
        return {
            "LABEL": [np.array([n.encode("utf-8")], dtype=np.object_) for n in names],
            "SCORES": scores,
            "TRUNCATED": truncated(encodings),
        }

    def probs(self, texts: list[str]) -> np.ndarray:
        """Scores of `texts` run as one dynamic batch (the gate's in-process path)."""
        return np.stack(self.probabilities(self.text.encode(texts)))
