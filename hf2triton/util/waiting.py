"""Waiting for something to become true: a server to start, a model to load, an endpoint to
answer. One polling loop for the library, the benchmarks and the tests."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable

from hf2triton.errors import DeployError


def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    interval_s: float = 0.5,
    proc: subprocess.Popen | None = None,
) -> bool:
    """Poll `predicate` until it is true (True) or `timeout_s` passed (False); a predicate that
    raises counts as not yet true (a server still starting answers with all sorts of errors).
    With `proc`, stop waiting (False) as soon as that process has exited: it never will be."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return True
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if proc is not None and proc.poll() is not None:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def wait_for(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    proc: subprocess.Popen | None = None,
    interval_s: float = 0.3,
    error: type[Exception] = DeployError,
) -> None:
    """`wait_until`, raising `error` when it fails: "`what` within N s", or, when `proc`
    exited, "`what`: its process exited with code C"."""
    if wait_until(predicate, timeout_s, interval_s, proc):
        return
    if proc is not None and proc.poll() is not None:
        raise error(f"{what}: its process exited with code {proc.returncode}")
    raise error(f"{what} within {timeout_s:.0f}s")


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a GET of `url` answers 200 (a health or readiness endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status == 200
    except OSError:
        return False
