"""What every served model shares: one dynamic batch of requests in, one answer per request out.

A model parses each request's input arrays into rows (`parse`), runs all rows of the batch
together (`run`), and the rows' outputs go back to the requests they came from, in order. A
request that cannot be parsed is answered with its error message alone.

A row whose parsing is dear (an image or audio file to decode) can be left `Deferred` by `parse`:
`parse_all` then does every deferred row of the batch side by side on the host's cores (Pillow,
libsndfile and numpy release the GIL while they work), where one request after another would
leave all cores but one idle while the graph waits.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np


@dataclass(frozen=True)
class Tensor:
    """One Triton input or output of a served model, as its config.pbtxt declares it: the
    served class is the one place that says so, and the config is rendered from it.

    `dtype` is Triton's type without its prefix ("STRING", "FP32", "INT32", "BOOL"); a dim
    that is a name ("embedding_dim") is a fact of the model, filled in when the config is
    rendered; `ragged`: rows of one dynamic batch may differ in length."""

    name: str
    dtype: str
    dims: tuple[int | str, ...] = (1,)
    optional: bool = False
    ragged: bool = False


# What most served models read and say: one text per row, and whether it was cut.
TEXT = Tensor("TEXT", "STRING")
TRUNCATED = Tensor("TRUNCATED", "BOOL")


@dataclass(frozen=True)
class Deferred:
    """A row `parse` leaves for `parse_all` to make: `make()` returns the row, or raises
    ValueError with the message for the client (naming the item)."""

    make: Callable[[], Any]


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """The process's workers for deferred rows: one a core (2 to 8), made on first use."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(
                max(2, min(8, cores())), thread_name_prefix="hf2triton-parse"
            )
        return _POOL


def made(row: Deferred) -> tuple[Any, str | None]:
    """(the row, None), or (None, the client's message) when it is refused."""
    try:
        return row.make(), None
    except ValueError as exc:
        return None, str(exc)


class ServedModel:
    """Subclasses set `inputs` (the Triton inputs they read, required ones first), `outputs`
    and implement `parse` and `run`."""

    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[Tensor, ...] = ()

    def parse(self, arrays: dict[str, np.ndarray]) -> list[Any]:
        """The rows of one request; ValueError with a message for the client if it is bad."""
        raise NotImplementedError

    def run(self, rows: list[Any]) -> dict[str, list[np.ndarray]]:
        """Every output for every row, rows in the order given."""
        raise NotImplementedError

    def parse_all(
        self, requests: list[dict[str, np.ndarray]]
    ) -> tuple[list[Any], list[Any], list[int]]:
        """(answers: a bad request's error message, None for the others; every good request's
        rows; the request each row came from)."""
        answers: list[Any] = [None] * len(requests)
        rows: list[Any] = []
        owners: list[int] = []
        for r, arrays in enumerate(requests):
            try:
                parsed = self.parse(arrays)
            except ValueError as exc:
                answers[r] = str(exc)
                continue
            rows.extend(parsed)
            owners.extend([r] * len(parsed))
        deferred = [k for k, row in enumerate(rows) if isinstance(row, Deferred)]
        if not deferred:
            return answers, rows, owners
        if len(deferred) == 1:
            done = [made(rows[deferred[0]])]
        else:
            done = list(pool().map(made, [rows[k] for k in deferred]))
        for k, (row, refused) in zip(deferred, done):
            rows[k] = row
            if refused is not None and answers[owners[k]] is None:
                answers[owners[k]] = refused  # the request's first refused row says why
        keep = [k for k in range(len(rows)) if answers[owners[k]] is None]
        return answers, [rows[k] for k in keep], [owners[k] for k in keep]

    def answer(self, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray] | str]:
        """Each request's outputs (arrays with one row per input row), or its error message."""
        answers, rows, owners = self.parse_all(requests)
        if not rows:
            return answers
        outputs = self.run(rows)
        mine: dict[int, list[int]] = {}
        for k, r in enumerate(owners):
            mine.setdefault(r, []).append(k)
        for r, ks in mine.items():
            answers[r] = {t.name: np.stack([outputs[t.name][k] for k in ks]) for t in self.outputs}
        return answers


@overload
def column(arrays: dict[str, np.ndarray], name: str) -> np.ndarray: ...


@overload
def column(arrays: dict[str, np.ndarray], name: str, required: Literal[True]) -> np.ndarray: ...


@overload
def column(arrays: dict[str, np.ndarray], name: str, required: bool) -> np.ndarray | None: ...


def column(arrays: dict[str, np.ndarray], name: str, required: bool = True) -> np.ndarray | None:
    """An input of shape [batch, n]; None for an optional input the request left out."""
    arr = arrays.get(name)
    if arr is None:
        if required:
            raise ValueError(f"the request has no input {name}")
        return None
    if arr.ndim != 2:
        raise ValueError(f"{name} must have shape [batch, n], got {list(arr.shape)}")
    return arr


def texts(arr: np.ndarray, name: str) -> list[list[str]]:
    """UTF-8 strings of a BYTES input [batch, n], row by row."""
    out = []
    for i, row in enumerate(arr):
        decoded = []
        for j, raw in enumerate(row):
            try:
                decoded.append(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
            except UnicodeDecodeError as exc:
                where = f"{name}[{i}]" if arr.shape[1] == 1 else f"{name}[{i}][{j}]"
                raise ValueError(f"{where} is not valid UTF-8: {exc}") from None
        out.append(decoded)
    return out


def text_column(arrays: dict[str, np.ndarray], name: str = "TEXT") -> list[str]:
    """One text per row of a [batch, 1] BYTES input."""
    arr = column(arrays, name)
    if arr.shape[1] != 1:
        raise ValueError(f"{name} must have shape [batch, 1], got {list(arr.shape)}")
    return [row[0] for row in texts(arr, name)]


def value_column(arrays: dict[str, np.ndarray], name: str, rows: int) -> list[Any]:
    """One value per row of an optional [batch, 1] input, as a Python scalar (None for each
    row when the request leaves it out)."""
    arr = column(arrays, name, required=False)
    if arr is None:
        return [None] * rows
    if arr.shape != (rows, 1):
        raise ValueError(
            f"{name} needs one value per text: shape [{rows}, 1], got {list(arr.shape)}"
        )
    return [v.item() if hasattr(v, "item") else v for v in arr[:, 0]]


def int_column(arrays: dict[str, np.ndarray], name: str, rows: int) -> list[int | None]:
    """One integer per row of an optional [batch, 1] input (None when the request leaves it out)."""
    return [None if v is None else int(v) for v in value_column(arrays, name, rows)]
