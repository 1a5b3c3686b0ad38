"""The original PyTorch model every kind compares with, and the export check that runs it beside
the exported ONNX graph on the same tokenized inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def batched(items: list[Any], size: int):
    for i in range(0, len(items), size):
        yield items[i: i + size]


class TorchReference:
    """A transformers model of `auto_class` and its tokenizer. Rows are texts or (text, text)
    pairs, truncated at `max_length` as the served model truncates them."""

    def __init__(self, model_dir: str | Path, auto_class: str, max_length: int):
        import torch
        import transformers

        self._torch = torch
        self.max_length = max_length
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
        self.model = getattr(transformers, auto_class).from_pretrained(str(model_dir)).eval()

    def encode(self, rows: list[Any]) -> dict[str, np.ndarray]:
        if rows and isinstance(rows[0], tuple):
            return self.tokenizer([r[0] for r in rows], [r[1] for r in rows], padding=True,
                                  truncation=True, max_length=self.max_length,
                                  return_tensors="np")
        return self.tokenizer(rows, padding=True, truncation=True, max_length=self.max_length,
                              return_tensors="np")

    def output(self, enc: dict[str, np.ndarray], name: str) -> np.ndarray:
        """One output of the model (`last_hidden_state`, `logits`) as float32 numpy."""
        torch = self._torch
        with torch.inference_mode():
            out = self.model(**{k: torch.from_numpy(v) for k, v in enc.items()})
        return getattr(out, name).float().numpy()

    def outputs(self, rows: list[Any], name: str, batch_size: int = 32) -> list[np.ndarray]:
        """`name` for every batch of rows (with the batch's attention mask)."""
        parts = []
        for chunk in batched(rows, batch_size):
            enc = self.encode(chunk)
            parts.append((self.output(enc, name), enc["attention_mask"]))
        return parts


def onnx_output(onnx_path: str | Path, enc: dict[str, np.ndarray], name: str | None = None
                ) -> np.ndarray:
    """One output of an ONNX graph (the first when `name` is None) on tokenized inputs."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feed = {k: v.astype(np.int64) for k, v in enc.items() if k in names}
    if "token_type_ids" in names and "token_type_ids" not in feed:
        feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
    return session.run([name] if name else None, feed)[0]


def largest_difference(reference: TorchReference, onnx_path: str | Path, rows: list[Any],
                       torch_output: str, onnx_name: str | None, masked: bool) -> float:
    """Largest |ONNX - PyTorch| over `rows` (over real tokens only when `masked`); inf for a
    NaN or inf anywhere, which max() would silently skip."""
    worst = 0.0
    for chunk in batched(rows, 8):
        enc = reference.encode(chunk)
        diff = np.abs(reference.output(enc, torch_output) - onnx_output(onnx_path, enc,
                                                                         onnx_name))
        if masked:
            diff = diff[enc["attention_mask"].astype(bool)]
        if not np.isfinite(diff).all():
            return float("inf")
        worst = max(worst, float(diff.max()))
    return worst
