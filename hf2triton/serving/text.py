"""Tokenize with the model's tokenizer.json, run the ONNX graph in token-aware sub-batches, and
hand each sub-batch's outputs to the model kind (pooling, labels, scores).

Token-aware batching: a dynamic batch mixes one-word queries with 250-token passages, and one
padded batch pays for the longest text in every row. The rows are sorted by length and cut into
sub-batches whose padded size (rows x longest) stays under `max_batch_tokens`, as
text-embeddings-inference's `max_batch_tokens` does; the results go back in request order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import runtimes
from .base import ServedModel

# The ONNX graph's inputs we feed; any other input is an error of the export.
INT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# The most rows a shape-range runtime (TensorRT) is told to expect; it caps this by its own
# max_rows setting.
MAX_ROWS = 1 << 16
# The most rows a bucketing runtime's shapes are warmed for (Triton's max_batch_size on a GPU).
WARM_ROWS = 64


def plan_sub_batches(lengths: Sequence[int], max_batch_tokens: int = 0) -> list[list[int]]:
    """Row indices grouped for one ONNX run each.

    Without a budget (0): one group, in the order given. With one: rows sorted by length, each
    group as many rows as keep rows x longest within the budget (a row longer than the budget
    runs alone).

    Example:
        >>> plan_sub_batches([3, 250, 4, 5], max_batch_tokens=16)
        [[0, 2, 3], [1]]
    """
    if max_batch_tokens <= 0:
        return [list(range(len(lengths)))] if len(lengths) else []
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted ascending: the row being added is the longest of its group.
        if current and (len(current) + 1) * lengths[i] > max_batch_tokens:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    return groups


def bucket_shape(rows: int, width: int, pad_to: int, max_length: int) -> tuple[int, int]:
    """The shape a sub-batch of `rows` x `width` tokens runs as: itself, or for a runtime that
    asks for few shapes (`pad_to` > 0), rows up to a power of two and the width up to a multiple
    of pad_to (never past max_length, nor below the width itself).

    Example:
        >>> bucket_shape(5, 40, pad_to=32, max_length=256), bucket_shape(5, 40, 0, 256)
        ((8, 64), (5, 40))
    """
    if not pad_to:
        return rows, width
    wide = max(width, min(-(-width // pad_to) * pad_to, max_length))
    return 1 << (rows - 1).bit_length(), wide


def _pad_id(tokenizer: Any) -> int:
    """Padded positions are masked out of attention and pooling, so any valid id works; the
    tokenizer's own pad token when it names one."""
    pad = tokenizer.padding or {}
    if pad.get("pad_id") is not None:
        return int(pad["pad_id"])
    for token in ("[PAD]", "<pad>"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return 0


class OnnxText:
    """A tokenizer.json and an ONNX graph taking token ids, run by a runtime (runtimes/;
    default ONNX Runtime on CPU, fp32)."""

    def __init__(
        self,
        onnx_path: str,
        tokenizer_path: str,
        max_length: int,
        threads: int = 0,
        max_batch_tokens: int = 0,
        runtime: runtimes.RuntimeSettings | None = None,
    ):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(tokenizer_path)
        # A saved tokenizer.json may carry its own padding (all-MiniLM-L6-v2's pads to 128) and
        # truncation: rows are padded here, per sub-batch, and cut at the model's max_length.
        self.pad_id = _pad_id(self.tokenizer)
        self.tokenizer.no_padding()
        self.max_length = int(max_length)
        self.tokenizer.enable_truncation(max_length=self.max_length)
        self.max_batch_tokens = int(max_batch_tokens)
        runtime = runtime or runtimes.settings_of({"intra_op_threads": threads})
        # What we will feed: [rows, tokens] id tensors up to max_length tokens (a runtime that
        # builds engines per shape range builds them for this).
        shapes = {name: ((1, 1), (MAX_ROWS, self.max_length)) for name in INT_INPUTS}
        self.session = runtimes.open_model(onnx_path, runtime, shapes)
        self.input_names = set(self.session.inputs)
        odd = self.input_names - set(INT_INPUTS)
        if odd:
            raise ValueError(f"{onnx_path} takes inputs {sorted(odd)} besides token ids")
        self.output_meta = self.session.outputs  # name -> Port(name, shape)
        self.warm_buckets()

    @classmethod
    def of(cls, onnx_path: str, tokenizer_path: str, settings: dict[str, Any]) -> OnnxText:
        """The graph and tokenizer as serving.json sets them up: max_length, max_batch_tokens
        and the runtime."""
        return cls(
            onnx_path,
            tokenizer_path,
            settings["max_length"],
            max_batch_tokens=int(settings.get("max_batch_tokens", 0)),
            runtime=runtimes.settings_of(settings),
        )

    def encode(self, rows: Sequence[str] | Sequence[tuple[str, str]]) -> list[Any]:
        """Encodings of texts, or of (text, text) pairs (special tokens as the model wants)."""
        return self.tokenizer.encode_batch(list(rows)) if rows else []

    def bucket(self, rows: int, width: int) -> tuple[int, int]:
        """The shape a sub-batch of `rows` x `width` tokens runs as on this runtime."""
        return bucket_shape(rows, width, self.session.pad_to, self.max_length)

    def bucket_shapes(self) -> list[tuple[int, int]]:
        """Every shape a bucketing runtime meets (up to WARM_ROWS rows, within the token budget
        where there is one); none for a runtime that does not bucket."""
        pad_to = self.session.pad_to
        if not pad_to:
            return []
        widths = sorted({self.bucket(1, w)[1] for w in range(1, self.max_length + 1)})
        shapes = []
        for width in widths:
            rows = 1
            while rows <= WARM_ROWS:
                if self.max_batch_tokens and rows > 1 and rows * width > 2 * self.max_batch_tokens:
                    break  # sub-batches stay within the budget before their rows are rounded up
                shapes.append((rows, width))
                rows *= 2
        return shapes

    def warm_buckets(self) -> int:
        """Run every bucket shape once, so that no served request waits for its kernels to be
        built; the number of shapes run."""
        shapes = self.bucket_shapes()
        names = [n for n in INT_INPUTS if n in self.input_names]
        for rows, width in shapes:
            mask = np.zeros((rows, width), dtype=np.int64)
            mask[:, 0] = 1
            feed = {"input_ids": np.full((rows, width), self.pad_id, dtype=np.int64)}
            feed.update(attention_mask=mask, token_type_ids=np.zeros((rows, width), np.int64))
            self.session.run(None, {n: feed[n] for n in names})
        return len(shapes)

    def padded(self, encodings: list[Any]) -> dict[str, np.ndarray]:
        """One sub-batch's token ids, attention mask and token types, padded to its longest (or
        to its bucket: the rows added hold one unmasked pad token each, as a fully masked row
        can turn fp16 attention into NaN; callers read only their own rows)."""
        rows, width = self.bucket(len(encodings), max(len(e.ids) for e in encodings))
        ids = np.full((rows, width), self.pad_id, dtype=np.int64)
        mask = np.zeros((rows, width), dtype=np.int64)
        mask[len(encodings) :, 0] = 1
        types = np.zeros((rows, width), dtype=np.int64)
        for row, e in enumerate(encodings):
            ids[row, : len(e.ids)] = e.ids
            mask[row, : len(e.ids)] = 1
            types[row, : len(e.ids)] = e.type_ids
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    def feeds(self, encodings: list[Any]) -> dict[str, np.ndarray]:
        """What the graph is fed for one sub-batch: the inputs it takes."""
        return {k: v for k, v in self.padded(encodings).items() if k in self.input_names}

    def forward(
        self,
        encodings: list[Any],
        outputs: list[str],
        reduce: Callable[[dict[str, np.ndarray], np.ndarray], np.ndarray],
    ) -> list[Any]:
        """`reduce(outputs, attention_mask)` of every sub-batch, scattered back to row order."""
        lengths = [len(e.ids) for e in encodings]
        groups = plan_sub_batches(lengths, self.max_batch_tokens)
        cap = self.session.max_rows
        if cap:  # a runtime whose engines take at most `cap` rows
            groups = [g[i : i + cap] for g in groups for i in range(0, len(g), cap)]
        padded = [self.padded([encodings[i] for i in group]) for group in groups]
        masks = [named["attention_mask"] for named in padded]
        feeds = [{k: v for k, v in named.items() if k in self.input_names} for named in padded]
        result: list[Any] = [None] * len(encodings)
        # Sub-batches are independent: a runtime with several streams runs them side by side.
        for group, mask, out in zip(groups, masks, self.session.run_many(outputs, feeds)):
            reduced = reduce(dict(zip(outputs, out)), mask)
            for row, i in enumerate(group):
                result[i] = reduced[row]
        return result


def truncated(encodings: list[Any]) -> list[np.ndarray]:
    """Per row: was the text cut at max_length (the tokenizer keeps the tail in .overflowing)."""
    return [np.array([len(e.overflowing) > 0], dtype=bool) for e in encodings]


class TextModel(ServedModel):
    """A served model over one ONNX graph and its tokenizer.json (serving.json: max_length,
    runtime (or intra_op_threads), max_batch_tokens, and the file names `onnx` and
    `tokenizer`)."""

    def __init__(self, onnx_path: str, tokenizer_path: str, settings: dict[str, Any]):
        self.settings = settings
        self.text = OnnxText.of(onnx_path, tokenizer_path, settings)

    @classmethod
    def from_directory(cls, directory: str, settings: dict[str, Any]) -> TextModel:
        return cls(
            os.path.join(directory, settings.get("onnx", "model.onnx")),
            os.path.join(directory, settings.get("tokenizer", "tokenizer.json")),
            settings,
        )
