"""Free TCP ports for servers this project starts on loopback (tritonserver, MLflow, test
registries), each one reserved for its caller so no other caller, in this process or another, is
handed it too.

A port is taken from outside the kernel's ephemeral range, so no outgoing connection is given it
between the moment it is chosen and the moment the server binds it; it must bind now; and it is
held under an exclusive lock (a file per port in a directory every process shares) until the
caller releases it or the process exits. Closing the probing socket and handing out the number,
as `bind(0)` helpers do, leaves the port to whoever asks next.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hf2triton.errors import EnvironmentSetupError

LOCK_DIR = Path(tempfile.gettempdir()) / "hf2triton-ports"
LOWEST = 10000  # below: well-known and registered services (8000, 5000, 5432, ...)
EPHEMERAL_DEFAULT = (32768, 60999)

_held: dict[int, int] = {}  # port -> file descriptor holding its lock
_guard = threading.Lock()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default elsewhere)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT


def pool() -> list[int]:
    """The ports `free_ports` chooses from: 10000-65535 less the ephemeral range."""
    lo, hi = ephemeral_range()
    return [p for p in range(LOWEST, 65536) if not lo <= p <= hi]


def _lock_dir() -> Path:
    if not LOCK_DIR.is_dir():
        LOCK_DIR.mkdir(exist_ok=True)
        try:  # shared by every user's processes: ports are the machine's, not a user's
            os.chmod(LOCK_DIR, 0o1777)
        except OSError:
            pass
    return LOCK_DIR


def _lock(port: int) -> int | None:
    """The descriptor of `port`'s lock file, locked; None if another holder has it."""
    try:
        fd = os.open(_lock_dir() / str(port), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise EnvironmentSetupError(
            f"cannot reserve ports: {LOCK_DIR} is not writable ({exc.strerror}); make it "
            f"writable for every user (chmod 1777) or set TMPDIR to a directory that is"
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return fd


def _binds(port: int, host: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(
    n: int, host: str = "127.0.0.1", candidates: Iterable[int] | None = None
) -> list[int]:
    """`n` distinct ports that bind on `host` now, reserved until `release` or process exit.

    `candidates` narrows the choice (default: `pool()`, tried from a random place on)."""
    if candidates is None:
        ports = pool()
        start = random.randrange(len(ports))
        ports = ports[start:] + ports[:start]
    else:
        ports = list(candidates)
    found: list[int] = []
    with _guard:
        for port in ports:
            if len(found) == n:
                break
            if port in _held:
                continue
            fd = _lock(port)
            if fd is None:
                continue
            if not _binds(port, host):
                os.close(fd)
                continue
            _held[port] = fd
            found.append(port)
    if len(found) < n:
        release(found)
        raise EnvironmentSetupError(
            f"found {len(found)} of {n} free ports on {host}: stop servers this machine no "
            f"longer needs, or free ports outside the ephemeral range {ephemeral_range()}"
        )
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """One port of `free_ports`."""
    return free_ports(1, host)[0]


def release(ports: Iterable[int]) -> None:
    """Give reserved ports back (their servers have stopped)."""
    with _guard:
        for port in ports:
            fd = _held.pop(port, None)
            if fd is not None:
                os.close(fd)


@contextmanager
def reserved_ports(n: int, host: str = "127.0.0.1") -> Iterator[list[int]]:
    """`free_ports` for the length of a `with` block: for a server that stops inside it."""
    ports = free_ports(n, host)
    try:
        yield ports
    finally:
        release(ports)
