"""What every model kind reads and hands on: its validation data (`Data`), the candidates the gate
measures (`Candidate`), the settings it reads of the spec's validation section, and the helpers
that read a model's files and turn numpy values into JSON."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hf2triton.errors import ExportError, SpecError


class ValidationSettings(Protocol):
    """What a kind reads of the spec's `validation` section."""

    @property
    def sentences(self) -> str | None: ...

    @property
    def images(self) -> str | None: ...

    @property
    def audio(self) -> str | None: ...

    @property
    def smoke_sentences(self) -> int: ...


@dataclass
class Data:
    """A kind's validation data: `items` (one served request each: a text, or a query with its
    passages) and whatever else its metrics need (gold labels, reference translations)."""

    items: list[Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)

    def _per_item(self, pick: Callable[[list[Any]], list[Any]]) -> Data:
        # An extra that is a list as long as the items is one entry an item (gold labels,
        # reference transcripts): it follows them.
        n = len(self.items)
        return Data(
            pick(list(self.items)),
            {
                k: pick(v) if isinstance(v, list) and len(v) == n else v
                for k, v in self.extra.items()
            },
        )

    def part(self, start: int, stop: int) -> Data:
        """The items [start, stop), each with its extra entries (itself when that is all)."""
        if start <= 0 and stop >= len(self.items):
            return self
        return self._per_item(lambda v: v[start:stop])

    def reordered(self, order: list[int]) -> Data:
        """The items in `order` (a permutation of their indices), each with its extra entries."""
        return self._per_item(lambda v: [v[i] for i in order])


@dataclass(frozen=True)
class Candidate:
    """One ONNX variant the gate measures (a file, or a directory of files for seq2seq), on the
    runtime serving.json will name (None: ONNX Runtime, CPU, fp32, as versions before runtimes
    were plug-ins), and the runtime the gate runs it on (the same, but for a CPU numerics check
    of a GPU runtime)."""

    name: str  # e.g. "dynamic-int8/qint8/per-channel", "fp32", "fp32 on openvino bf16"
    onnx_path: str
    runtime: dict[str, Any] | None = None
    gate_runtime: dict[str, Any] | None = None
    error: str | None = None  # building its graph failed: the gate refuses it with this
    weights: str = ""  # the variant it runs (its method): candidates of one variant share weights
    # A graph built only when the gate first needs it (the search times its runtime's candidates,
    # or judges it): returns the built variant, its `onnx_path` or why it failed (`error`).
    build: Callable[[], Mapping[str, Any]] | None = field(default=None, compare=False, repr=False)

    @property
    def gated_runtime(self) -> dict[str, Any] | None:
        return self.gate_runtime or self.runtime

    @property
    def planned(self) -> bool:
        """Whether its graph is still to be built (`made`)."""
        return self.build is not None and not self.onnx_path and not self.error

    def made(self) -> Candidate:
        """This candidate with its graph built (itself when it is built already)."""
        if not self.planned:
            return self
        assert self.build is not None
        built = self.build()
        return replace(
            self, onnx_path=str(built.get("onnx_path", "")), error=built.get("error"), build=None
        )


def read_lines(path: str | Path | None, what: str, items: str = "sentences") -> list[str]:
    """Non-empty lines of a UTF-8 file; SpecError naming `what` (the spec key) otherwise."""
    if path is None:
        raise SpecError(f"{what} is not set: this kind reads its {items} from it")
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise SpecError(f"{what} file {str(p)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{what} file {str(p)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}): save "
            f"it as UTF-8, one of its {items} per line"
        ) from None
    except OSError as exc:
        raise SpecError(f"{what} file {str(p)!r} cannot be read: {exc.strerror}") from None
    found = [line for line in lines if line.strip()]
    if not found:
        raise SpecError(f"{what} file {str(p)!r} holds no {items}: put one per line")
    return found


def read_json(path: Path) -> Any:
    """A JSON file of a model's directory, or None when it is missing or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def model_max_length(model_dir: str | Path, max_length: int | None = None) -> int:
    """The truncation length the model's authors serve with: sentence-transformers'
    max_seq_length (all-MiniLM-L6-v2: 256, not the tokenizer's 512), else the smaller of the
    tokenizer's and the position embeddings' limits."""
    model_dir = Path(model_dir)
    if max_length is None:
        max_length = (read_json(model_dir / "sentence_bert_config.json") or {}).get(
            "max_seq_length"
        )
    if max_length is None:
        tok_cfg = read_json(model_dir / "tokenizer_config.json") or {}
        model_cfg = read_json(model_dir / "config.json") or {}
        limits = [
            v
            for v in (tok_cfg.get("model_max_length"), model_cfg.get("max_position_embeddings"))
            if isinstance(v, int) and 0 < v < 100_000
        ]
        max_length = min(limits) if limits else 512
    return int(max_length)


def save_fast_tokenizer(model_dir: str, out: Path) -> None:
    """Serving tokenizes with the `tokenizers` library: tokenizer.json must sit beside the
    exported graph."""
    if (out / "tokenizer.json").is_file():
        return
    if (Path(model_dir) / "tokenizer.json").is_file():
        shutil.copyfile(Path(model_dir) / "tokenizer.json", out / "tokenizer.json")
        return
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(model_dir, use_fast=True).save_pretrained(out)
    if not (out / "tokenizer.json").is_file():
        raise ExportError(
            f"{model_dir} has no fast tokenizer, which serving needs (tokenizer.json)"
        )


def to_json(value: Any) -> Any:
    """numpy values to plain JSON-able ones."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def take(values: Any, indices: list[int]) -> Any:
    """Rows `indices` of an array or list."""
    if isinstance(values, np.ndarray):
        return values[indices]
    return [values[i] for i in indices]


def timing_items(items: list[Any], n: int = 32) -> list[Any]:
    """What the in-process timing runs on: `n` items drawn from the validation data at random
    (seeded), every length, as a dynamic batch of real traffic holds them."""
    return random.Random(0).choices(items, k=n) if items else []
