"""Served sentence embeddings: TEXT [batch, 1] in, EMBEDDING [batch, dim] (pooled as the model
defines it, L2-normalised when it says so), TRUNCATED [batch, 1] and TOKENS [batch, 1] (the
tokens each text was embedded from: an API's usage) out."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import TEXT, TRUNCATED, Tensor, text_column
from .text import TextModel, truncated

# Token-level outputs we know how to pool; optimum names it differently per export library
# (transformers: last_hidden_state, sentence-transformers: token_embeddings).
TOKEN_OUTPUTS = ("last_hidden_state", "token_embeddings")


def pool(hidden: np.ndarray, mask: np.ndarray, pooling: str, normalize: bool) -> np.ndarray:
    """Pool token states [B, T, D] with attention mask [B, T] into [B, D] float32.

    The mean is one einsum of the mask with the states: no [B, T, D] copy (on an H200 the
    elementwise form was a fifth of a served stub's busy time; this is 4-6x faster) and no BLAS:
    np.matmul's batched product ran on OpenBLAS's threads, and 8 stubs each spinning 16 threads
    on 16 cores served 2,759 texts/s against 13,660 (docs/benchmarks.md, GPU)."""
    hidden = hidden.astype(np.float32, copy=False)
    if pooling == "cls":
        out = hidden[:, 0].copy()
    elif pooling == "mean":
        m = mask.astype(np.float32)
        out = np.einsum("btd,bt->bd", hidden, m)
        out /= np.clip(m.sum(axis=1, keepdims=True), 1e-9, None)
    else:
        raise ValueError(f"unknown pooling {pooling!r}")
    if normalize:
        out /= np.clip(np.linalg.norm(out, axis=1, keepdims=True), 1e-12, None)
    return out


class Embedder(TextModel):
    inputs = (TEXT,)
    outputs = (
        Tensor("EMBEDDING", "FP32", ("embedding_dim",)),
        TRUNCATED,
        Tensor("TOKENS", "INT32"),
    )

    def __init__(self, onnx_path: str, tokenizer_path: str, settings: dict[str, Any]):
        if settings["pooling"] not in ("mean", "cls"):
            raise ValueError(f"serving.json: unknown pooling {settings['pooling']!r}")
        self.pooling, self.normalize = settings["pooling"], bool(settings["normalize"])
        super().__init__(onnx_path, tokenizer_path, settings)
        names = list(self.text.output_meta)
        found = next((n for n in TOKEN_OUTPUTS if n in names), None) or next(
            (n for n, o in self.text.output_meta.items() if len(o.shape) == 3), None
        )
        if found is None:
            raise ValueError(f"{onnx_path} has no token-level (3-D) output among {names}")
        self.token_output = found

    def parse(self, arrays: dict[str, np.ndarray]) -> list[str]:
        return text_column(arrays)

    def run(self, rows: list[str]) -> dict[str, list[np.ndarray]]:
        encodings = self.text.encode(rows)
        emb = self.text.forward(
            encodings,
            [self.token_output],
            lambda out, mask: pool(out[self.token_output], mask, self.pooling, self.normalize),
        )
        return {
            "EMBEDDING": emb,
            "TRUNCATED": truncated(encodings),
            "TOKENS": [np.array([len(e.ids)], np.int32) for e in encodings],
        }

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embeddings of `texts` run as one dynamic batch (the gate's in-process path)."""
        return np.stack(self.run(texts)["EMBEDDING"]) if texts else np.zeros((0, 0), np.float32)
