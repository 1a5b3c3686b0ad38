"""Memory-heavy work (an ONNX export, PyTorch's reference answers) in a process of its own, so a
release's own process keeps none of it: CPython, PyTorch and glibc hand little of a freed heap
back to the system, and a 135M-parameter chat model's export left the release at 2.6 GB for the
rest of its run. (The peak is another matter: the export's own is about 7x the model's fp32
size wherever it runs; docs/benchmarks.md "What a release costs".) A child started fresh
(`spawn`: no locks or thread pools inherited from the flow's threads) returns its memory when it
exits. Starting one costs its imports (seconds), so work on weights under `isolate_above()`
stays in this process: the tests' tiny models, and the small models whose copies cost little.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

from hf2triton.errors import Hf2TritonError, SpecError, WorkerDiedError

T = TypeVar("T")
P = ParamSpec("P")

# Weights of at least this many bytes (as fp32) are worked on in a child process.
ISOLATE_ABOVE = 256 * 2**20
ENV = "HF2TRITON_ISOLATE_ABOVE_MB"


def isolate_above() -> int:
    """The weight size (bytes) from which work runs in a child: HF2TRITON_ISOLATE_ABOVE_MB, or
    256 MB (0: always; a value above any model's size: never)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return ISOLATE_ABOVE
    try:
        return int(float(raw) * 2**20)
    except ValueError:
        raise SpecError(
            f"{ENV}={raw!r} is not a number of MB: set it to e.g. 256 (0: always in a child "
            "process), or unset it"
        ) from None


def isolates(weight_bytes: int) -> bool:
    """Whether work on weights of `weight_bytes` (as fp32) runs in a child (`run_isolated`)."""
    return weight_bytes >= isolate_above()


def _child(
    conn: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    try:  # Linux: die with the release's process rather than work on for nobody
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    try:
        result: tuple[str, Any] = ("ok", fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - sent to the parent, raised there
        result = ("raised", exc)
    try:
        conn.send(result)
    except Exception as exc:  # noqa: BLE001 - an exception that does not pickle: its text
        conn.send(("raised", Hf2TritonError(f"{type(result[1]).__name__}: {result[1]} ({exc})")))
    conn.close()


def run_isolated(
    what: str, weight_bytes: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """`fn(*args)`, in a child process when the weights it works on weigh `weight_bytes` or more
    (else here). `fn` and its arguments are pickled: a module-level function and plain data.
    What it raises is raised here; a child that dies without answering raises `WorkerDiedError`
    naming `what` and how it ended."""
    if not isolates(weight_bytes):
        return fn(*args, **kwargs)
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args, kwargs), name=f"hf2triton {what}")
    proc.start()
    send.close()
    try:
        status, value = receive.recv()
    except EOFError:
        proc.join()
        raise WorkerDiedError(
            f"the {what} process ended without an answer ({ending(proc.exitcode)}): "
            "see the kernel log (dmesg) for an out-of-memory kill, give the release "
            f"more memory, or set {ENV} above the model's size to run it in the "
            "release's own process"
        ) from None
    except BaseException as exc:  # interrupted (or an answer that does not unpickle)
        proc.kill()
        proc.join()
        if isinstance(exc, Exception):
            raise Hf2TritonError(f"the {what} process's answer could not be read: {exc}") from exc
        raise
    finally:
        receive.close()
    proc.join()
    if status == "raised":
        raise value
    return cast("T", value)


def ending(code: int | None) -> str:
    """How a child process ended, in words."""
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        return f"killed by {name}" + (" (most often: out of memory)" if name == "SIGKILL" else "")
    return f"exit code {code}"
