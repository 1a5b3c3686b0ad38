"""Sentence embeddings the way the model defines them, computed by PyTorch (the reference) and by
ONNX Runtime (the candidate), so export, validation and smoke tests compare like with like.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hf2triton.errors import SpecError


@dataclass(frozen=True)
class EmbeddingConfig:
    """How token states become one sentence vector; written to the served model's serving.json."""

    pooling: str  # "mean" or "cls"
    normalize: bool
    max_length: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _read_json(path: Path) -> dict[str, Any] | list[Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def resolve_embedding_config(
    model_dir: str | Path, pooling: str = "auto", normalize: bool | str = "auto",
    max_length: int | None = None,
) -> EmbeddingConfig:
    """Fill 'auto' from the model's own sentence-transformers files, so serving truncates and
    pools as the model's authors do (all-MiniLM-L6-v2 declares max_seq_length 256, not 512)."""
    model_dir = Path(model_dir)
    modules = _read_json(model_dir / "modules.json") or []
    if pooling == "auto":
        pooling = "mean"
        for module in modules if isinstance(modules, list) else []:
            if module.get("type", "").endswith("Pooling"):
                cfg = _read_json(model_dir / module.get("path", "") / "config.json") or {}
                if cfg.get("pooling_mode_cls_token"):
                    pooling = "cls"
    if normalize == "auto":
        normalize = any(
            isinstance(m, dict) and m.get("type", "").endswith("Normalize")
            for m in (modules if isinstance(modules, list) else [])
        )
    if max_length is None:
        st_cfg = _read_json(model_dir / "sentence_bert_config.json") or {}
        max_length = st_cfg.get("max_seq_length")
    if max_length is None:
        tok_cfg = _read_json(model_dir / "tokenizer_config.json") or {}
        model_cfg = _read_json(model_dir / "config.json") or {}
        limits = [
            v for v in (tok_cfg.get("model_max_length"), model_cfg.get("max_position_embeddings"))
            if isinstance(v, int) and 0 < v < 100_000
        ]
        max_length = min(limits) if limits else 512
    return EmbeddingConfig(pooling=pooling, normalize=bool(normalize), max_length=int(max_length))


def pool(hidden: np.ndarray, mask: np.ndarray, cfg: EmbeddingConfig) -> np.ndarray:
    """Pool token states [B, T, D] with attention mask [B, T] into [B, D] float32."""
    hidden = hidden.astype(np.float32)
    if cfg.pooling == "cls":
        out = hidden[:, 0]
    else:
        m = mask[..., None].astype(np.float32)
        out = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
    if cfg.normalize:
        out = out / np.clip(np.linalg.norm(out, axis=1, keepdims=True), 1e-12, None)
    return out.astype(np.float32)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of matching rows of a and b."""
    a = a / np.clip(np.linalg.norm(a, axis=1, keepdims=True), 1e-12, None)
    b = b / np.clip(np.linalg.norm(b, axis=1, keepdims=True), 1e-12, None)
    return (a * b).sum(axis=1)


def read_sentences(path: str | Path) -> list[str]:
    """Read a one-sentence-per-line UTF-8 file; empty lines are ignored."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise SpecError(f"validation.sentences file {str(p)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"validation.sentences file {str(p)!r} is not UTF-8 text ({exc.reason} at byte "
            f"{exc.start}): save it as UTF-8, one sentence per line"
        ) from None
    except OSError as exc:
        raise SpecError(
            f"validation.sentences file {str(p)!r} cannot be read: {exc.strerror}"
        ) from None
    sentences = [line for line in lines if line.strip()]
    if not sentences:
        raise SpecError(
            f"validation.sentences file {str(p)!r} holds no sentences: put one per line"
        )
    return sentences


def batched(items: list[Any], size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


class TorchEmbedder:
    """The original PyTorch model, the reference every other embedding is compared with."""

    def __init__(self, model_dir: str | Path, cfg: EmbeddingConfig):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self._torch = torch
        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModel.from_pretrained(str(model_dir)).eval()

    def encode(self, texts: list[str]) -> dict[str, Any]:
        return self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.cfg.max_length,
            return_tensors="np",
        )

    def hidden_states(self, enc: dict[str, np.ndarray]) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            out = self.model(**{k: torch.from_numpy(v) for k, v in enc.items()})
        return out.last_hidden_state.float().numpy()

    def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        parts = []
        for chunk in batched(texts, batch_size):
            enc = self.encode(chunk)
            parts.append(pool(self.hidden_states(enc), enc["attention_mask"], self.cfg))
        return np.concatenate(parts)


class OnnxEmbedder:
    """An exported (and maybe quantized) ONNX model, run in-process by ONNX Runtime."""

    def __init__(self, onnx_path: str | Path, tokenizer: Any, cfg: EmbeddingConfig,
                 threads: int = 0):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(onnx_path), options, providers=["CPUExecutionProvider"]
        )
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.tokenizer = tokenizer
        self.cfg = cfg

    def hidden_states(self, enc: dict[str, np.ndarray]) -> np.ndarray:
        feed = {k: v.astype(np.int64) for k, v in enc.items() if k in self.inputs}
        if "token_type_ids" in self.inputs and "token_type_ids" not in feed:
            feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
        return self.session.run(None, feed)[0]

    def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        parts = []
        for chunk in batched(texts, batch_size):
            enc = self.tokenizer(
                chunk, padding=True, truncation=True, max_length=self.cfg.max_length,
                return_tensors="np",
            )
            parts.append(pool(self.hidden_states(enc), enc["attention_mask"], self.cfg))
        return np.concatenate(parts)
