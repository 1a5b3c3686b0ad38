"""The original PyTorch model every kind compares with, and the export check that runs it beside
the exported ONNX graph on the same tokenized inputs."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np

from hf2triton.kinds.generation_config import TranslationConfig, load_tokenizer


def batched(items: list[Any], size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def texts_of(rows: list[Any]) -> tuple[list[Any], ...]:
    """The tokenizer's text arguments for `rows`: the texts, or the pairs' firsts and seconds."""
    if rows and isinstance(rows[0], tuple):
        return [r[0] for r in rows], [r[1] for r in rows]
    return (rows,)


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
        return self.tokenizer(
            *texts_of(rows),
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="np",
        )

    def output(self, enc: dict[str, np.ndarray], name: str) -> np.ndarray:
        """One output of the model (`last_hidden_state`, `logits`) as float32 numpy."""
        torch = self._torch
        with torch.inference_mode():
            out = self.model(**{k: torch.from_numpy(v) for k, v in enc.items()})
        return getattr(out, name).float().numpy()

    def length_order(self, rows: list[Any]) -> np.ndarray:
        """The rows' indices, shortest first in tokens: a batch is padded to its longest row,
        and multilingual-e5-large's 350 validation texts in batches of 32 padded to 133,376
        tokens in file order, 21,600 in this order (12,548 real)."""
        ids = self.tokenizer(*texts_of(rows), truncation=True, max_length=self.max_length)
        return np.argsort([len(i) for i in ids["input_ids"]], kind="stable")

    def each_row(
        self, rows: list[Any], per_batch: Any, name: str, batch_size: int = 32
    ) -> np.ndarray:
        """`per_batch(output, attention_mask)` (one row of result per row) for every row,
        batched shortest first (`length_order`), answered in `rows`' order."""
        order = self.length_order(rows)
        found = np.concatenate(
            [
                per_batch(out, mask)
                for out, mask in self.outputs([rows[i] for i in order], name, batch_size)
            ]
        )
        answered = np.empty_like(found)
        answered[order] = found
        return answered

    def outputs(
        self, rows: list[Any], name: str, batch_size: int = 32
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """`name` for every batch of rows (with the batch's attention mask)."""
        parts = []
        for chunk in batched(rows, batch_size):
            enc = self.encode(chunk)
            parts.append((self.output(enc, name), enc["attention_mask"]))
        return parts


def onnx_output(
    onnx_path: str | Path, enc: dict[str, np.ndarray], name: str | None = None
) -> np.ndarray:
    """One output of an ONNX graph (the first when `name` is None) on tokenized inputs."""
    return onnx_outputs(onnx_path, [enc], name)[0]


def onnx_outputs(
    onnx_path: str | Path, encs: list[dict[str, np.ndarray]], name: str | None = None
) -> list[np.ndarray]:
    """One output of an ONNX graph for each of `encs`, from one session."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    found = []
    for enc in encs:
        feed = {k: v.astype(np.int64) for k, v in enc.items() if k in names}
        if "token_type_ids" in names and "token_type_ids" not in feed:
            feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
        found.append(session.run([name] if name else None, feed)[0])
    return found


def largest_difference(
    reference: TorchReference,
    onnx_path: str | Path,
    rows: list[Any],
    torch_output: str,
    onnx_name: str | None,
    masked: bool,
) -> float:
    """Largest |ONNX - PyTorch| over `rows` (over real tokens only when `masked`); inf for a
    NaN or inf anywhere, which max() would silently skip. PyTorch answers first and its model is
    let go (the caller hands it over) before ONNX Runtime loads the graph in one session: the
    check holds the weights once, not twice (a 2.1 GB embedder's check held both)."""
    encs = [reference.encode(chunk) for chunk in batched(rows, 8)]
    expected = [reference.output(enc, torch_output) for enc in encs]
    del reference
    gc.collect()
    worst = 0.0
    for enc, want, got in zip(encs, expected, onnx_outputs(onnx_path, encs, onnx_name)):
        mask = enc["attention_mask"].astype(bool) if masked else None
        worst = max(worst, abs_difference(want, got, mask))
    return worst


def abs_difference(want: Any, got: Any, mask: Any = None) -> float:
    """Largest |got - want| (over `mask`'s rows and tokens when given); inf for a NaN or inf
    anywhere: max() would skip a NaN (max(0.0, nan) is 0.0), and an export that answers NaN
    would pass its check."""
    diff = np.abs(np.asarray(want, np.float64) - np.asarray(got, np.float64))
    if mask is not None:
        diff = diff[mask]
    if not np.isfinite(diff).all():
        return float("inf")
    return float(diff.max()) if diff.size else 0.0


class TorchTranslator:
    """The original PyTorch model and `generate`: the reference."""

    def __init__(self, model_dir: str | Path, cfg: TranslationConfig):
        import torch
        from transformers import AutoModelForSeq2SeqLM

        self._torch = torch
        self.cfg = cfg
        self.tokenizer = load_tokenizer(model_dir, cfg.source_lang)
        self.model = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()

    def generate(
        self, texts: list[str], num_beams: int | None = None, batch_size: int = 16
    ) -> list[list[int]]:
        s = self.cfg.settings
        kwargs = dict(
            do_sample=False,
            num_beams=num_beams or s.num_beams,
            max_new_tokens=s.max_new_tokens,
            num_return_sequences=1,
            decoder_start_token_id=s.decoder_start_token_id,
            eos_token_id=s.eos_token_ids,
            pad_token_id=s.pad_token_id,
            forced_bos_token_id=s.forced_bos_token_id,
            forced_eos_token_id=s.forced_eos_token_id,
            min_length=s.min_length,
            no_repeat_ngram_size=s.no_repeat_ngram_size,
            repetition_penalty=s.repetition_penalty,
            bad_words_ids=s.bad_words_ids or None,
            length_penalty=s.length_penalty,
            early_stopping=s.early_stopping,
        )
        out: list[list[int]] = []
        for chunk in batched(texts, batch_size):
            enc = self.tokenizer(
                chunk,
                padding=True,
                truncation=True,
                max_length=self.cfg.max_input_length,
                return_tensors="pt",
            )
            with self._torch.inference_mode():
                ids = self.model.generate(**enc, **kwargs)
            out.extend(ids.tolist())
        return out

    def decode(self, sequences: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode(sequences, skip_special_tokens=True)


def strip_pad(seq: list[int], pad: int) -> list[int]:
    """A generated sequence without the padding `generate` appends to shorter rows."""
    end = len(seq)
    while end > 1 and seq[end - 1] == pad:
        end -= 1
    return list(seq[:end])
