"""Served cross-encoder reranking: QUERY [batch, 1] and PASSAGES [batch, n] in (each query with
its n passages; n may differ between requests), SCORES [batch, n] (one relevance score per
passage, higher is more relevant) and TRUNCATED [batch, n] out. Every (query, passage) pair of
the dynamic batch runs through the token-aware sub-batches together."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Tensor, column, text_column, texts
from .text import TextModel, truncated


def relevance(logits: np.ndarray, activation: str) -> np.ndarray:
    """One score per pair from the model's logits [n, labels]: the last label's logit ("none"),
    its sigmoid, or its softmax probability (two-label relevant/irrelevant heads)."""
    logits = logits.astype(np.float64).reshape(len(logits), -1)
    if activation == "softmax":
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return (e[:, -1] / e.sum(axis=1)).astype(np.float32)
    x = logits[:, -1]
    if activation == "sigmoid":
        x = 1 / (1 + np.exp(-x))
    elif activation != "none":
        raise ValueError(f"unknown activation {activation!r}")
    return x.astype(np.float32)


class Reranker(TextModel):
    # Queries [batch, 1] and, for each, its passages [batch, n]; n may differ from request to
    # request (ragged), and the answer has one score per passage.
    inputs = (Tensor("QUERY", "STRING"), Tensor("PASSAGES", "STRING", (-1,), ragged=True))
    outputs = (Tensor("SCORES", "FP32", (-1,)), Tensor("TRUNCATED", "BOOL", (-1,)))

    def __init__(self, onnx_path: str, tokenizer_path: str, settings: dict[str, Any]):
        self.activation = settings["activation"]
        relevance(np.zeros((1, 1)), self.activation)  # an unknown activation fails at load
        super().__init__(onnx_path, tokenizer_path, settings)

    def parse(self, arrays: dict[str, np.ndarray]) -> list[tuple[str, list[str]]]:
        queries = text_column(arrays, "QUERY")
        passages = column(arrays, "PASSAGES")
        if passages.shape[0] != len(queries):
            raise ValueError(
                f"PASSAGES has {passages.shape[0]} rows for {len(queries)} "
                "queries: one row of passages per query"
            )
        if passages.shape[1] == 0:
            raise ValueError("PASSAGES is empty: send at least one passage per query")
        return list(zip(queries, texts(passages, "PASSAGES")))

    def run(self, rows: list[tuple[str, list[str]]]) -> dict[str, list[np.ndarray]]:
        pairs = [(q, p) for q, passages in rows for p in passages]
        encodings = self.text.encode(pairs)
        scores = self.text.forward(
            encodings, ["logits"], lambda out, mask: relevance(out["logits"], self.activation)
        )
        cut = truncated(encodings)
        out: dict[str, list[np.ndarray]] = {"SCORES": [], "TRUNCATED": []}
        k = 0
        for _, passages in rows:
            n = len(passages)
            out["SCORES"].append(np.array(scores[k : k + n], dtype=np.float32))
            out["TRUNCATED"].append(np.concatenate(cut[k : k + n]))
            k += n
        return out

    def rerank(self, groups: list[tuple[str, list[str]]]) -> list[np.ndarray]:
        """Scores of each (query, passages) group run as one dynamic batch (the gate's path)."""
        return self.run(groups)["SCORES"]
