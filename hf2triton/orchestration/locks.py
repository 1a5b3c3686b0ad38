"""One run of a release at a time in an hf2triton home: a run holds an exclusive lock on
<home>/locks/<release>.lock for the whole release, so a second run of the same release (a schedule
and a training trigger at once) waits for the first, then reuses its finished steps, instead of
racing it to a second version. Prefect deployments also carry a concurrency limit
(hf2triton.orchestration.deployments); this lock covers `hf2triton release` and any run without a
server.

The lock is the operating system's (flock): it goes with the process that holds it, so a killed
run never leaves a stale lock behind. A second run waits at most HF2TRITON_LOCK_WAIT_S seconds
(default 3600, longer than a release takes; 0: do not wait), then stops with ReleaseBusyError
naming the run it waited for.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import socket
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from hf2triton.errors import EnvironmentSetupError, ReleaseBusyError
from hf2triton.util.runs import step_logger
from hf2triton.util.workspace import ensure_home

LOCK_WAIT_ENV = "HF2TRITON_LOCK_WAIT_S"
DEFAULT_LOCK_WAIT_S = 3600.0
POLL_S = 0.2  # how often a waiting run tries the lock again


def lock_wait_s() -> float:
    """Seconds a second run of a release waits for the first: $HF2TRITON_LOCK_WAIT_S, else 3600.

    Raises EnvironmentSetupError for a value that is not a number of seconds >= 0.
    """
    raw = os.environ.get(LOCK_WAIT_ENV, "").strip()
    if not raw:
        return DEFAULT_LOCK_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise EnvironmentSetupError(
            f"{LOCK_WAIT_ENV}={raw!r}: give the seconds a second run of a release waits for the "
            f"first, e.g. {LOCK_WAIT_ENV}={DEFAULT_LOCK_WAIT_S:.0f} (0: do not wait)"
        )
    return value


def lock_path(release: str) -> Path:
    """The lock file of `release` in this hf2triton home (its folder created)."""
    return ensure_home("locks") / "locks" / f"{release}.lock"


@contextlib.contextmanager
def release_lock(release: str, wait_s: float | None = None) -> Iterator[Path]:
    """Hold the lock of `release` for the `with` block, waiting up to `wait_s` seconds
    (default: lock_wait_s()) while another run holds it; yields the lock file.

    Raises ReleaseBusyError naming the run that holds it when the wait runs out.
    """
    wait_s = lock_wait_s() if wait_s is None else wait_s
    path = lock_path(release)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:  # closing the file releases the lock, on every way out
        _acquire(fd, path, release, wait_s)
        _write_holder(fd)
        try:
            yield path
        finally:
            with contextlib.suppress(OSError):  # a waiter must not name a run that ended
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _acquire(fd: int, path: Path, release: str, wait_s: float) -> None:
    if _try_lock(fd):
        return
    info = read_holder(path)
    for _ in range(10):  # the holder writes who it is just after it took the lock
        if info is not None:
            break
        time.sleep(POLL_S)
        if _try_lock(fd):
            return
        info = read_holder(path)
    holder = describe_holder(info)
    log = step_logger()
    log.info(
        "release %s: waiting for the release run by %s to finish (at most %.0f s: %s)",
        release,
        holder,
        wait_s,
        LOCK_WAIT_ENV,
    )
    started = time.monotonic()
    while (left := wait_s - (time.monotonic() - started)) > 0:
        time.sleep(min(POLL_S, left))
        if _try_lock(fd):
            log.info(
                "release %s: the release run by %s finished; this run goes on after waiting %.0f s",
                release,
                holder,
                time.monotonic() - started,
            )
            return
    holder = describe_holder(read_holder(path) or info)  # a third run may hold it by now
    raise ReleaseBusyError(
        f"release {release!r} is still being run by {holder}: this run waited {wait_s:.0f} s for "
        f"it ({LOCK_WAIT_ENV}) and ran no step. Run it again when that run has finished (it "
        f"reuses that run's finished steps), or set {LOCK_WAIT_ENV} to wait longer; the lock is "
        f"{path}"
    )


def _write_holder(fd: int) -> None:
    """Say in the lock file who holds it, for the message of a run that waits."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.now().astimezone().isoformat(sep=" ", timespec="seconds"),
        "flow_run": ctx.flow_run.name if ctx is not None and ctx.flow_run else None,
    }
    with contextlib.suppress(OSError):  # a full disk: the lock holds without its note
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)


def read_holder(path: Path) -> dict[str, Any] | None:
    """What the run holding the lock at `path` wrote about itself, or None."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and "pid" in info else None


def describe_holder(info: dict[str, Any] | None) -> str:
    """Who holds a lock: "pid 123 (flow run 'x') since 2025-01-02 03:04:05+00:00"."""
    if info is None:
        return "another process (it has not written which yet)"
    host = f" on {info['host']}" if info.get("host") not in (None, socket.gethostname()) else ""
    run = f" (flow run '{info['flow_run']}')" if info.get("flow_run") else ""
    return f"pid {info['pid']}{host}{run} since {info.get('since', '?')}"
