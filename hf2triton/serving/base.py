"""What every served model shares: one dynamic batch of requests in, one answer per request out.

A model parses each request's input arrays into rows (`parse`), runs all rows of the batch
together (`run`), and the rows' outputs go back to the requests they came from, in order. A
request that cannot be parsed is answered with its error message alone.

A row whose parsing is dear (an image or audio file to decode) can be left `Deferred` by `parse`:
`parse_all` then makes every deferred row of the batch side by side on the host's cores (Pillow,
FFmpeg's decoders through PyAV and numpy release the GIL while they work), where one request
after another would leave all cores but one idle while the graph waits.
"""

from __future__ import annotations

import logging
import math
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
    """The cores this process may run on: those it may be scheduled on, within its cgroup's
    CPU quota (a container limited to 2 CPUs on a 64-core node has 2)."""
    try:
        found = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        found = os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(found, math.ceil(quota))) if quota else found


def cpu_quota() -> float | None:
    """The CPUs the cgroup's quota allows (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` over
    `cpu.cfs_period_us`), or None where there is no quota."""
    try:
        quota, period = open_text("/sys/fs/cgroup/cpu.max").split()[:2]
    except (OSError, ValueError):
        try:
            quota = open_text("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").strip()
            period = open_text("/sys/fs/cgroup/cpu/cpu.cfs_period_us").strip()
        except OSError:
            return None
    if quota in ("max", "-1"):
        return None
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def open_text(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


# Deferred rows made at once: each decoded file holds its pixels or samples in memory (a 40 MP
# image about 360 MB while it is decoded), so a host of many cores does not decode dozens.
MAX_WORKERS = 4
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """The process's workers for deferred rows: one a core (2 to MAX_WORKERS), made on first
    use."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            workers = max(2, min(MAX_WORKERS, cores()))
            _POOL = ThreadPoolExecutor(workers, thread_name_prefix="hf2triton-parse")
        return _POOL


def made(row: Deferred) -> tuple[Any, str | None]:
    """(the row, None), or (None, the client's message) when it is refused. A deferred row is
    made from what the client sent (a file's bytes), so any error in making it is that item's:
    its request is refused and the batch's other requests are answered."""
    try:
        return row.make(), None
    except ValueError as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001 - a decoder's odd error on one file fails that file
        # Logged whole: a fault of the server's own (a dependency changed under it) would
        # otherwise show only as clients' 400s.
        logging.getLogger(__name__).warning(
            "a file was refused on %s", type(exc).__name__, exc_info=True
        )
        return None, f"the file could not be read ({type(exc).__name__}: {exc}): send it whole"


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
