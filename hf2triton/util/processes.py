"""Processes started in a session of their own (a tritonserver, the OpenAI-compatible API), and
what to do with what they leave: stopping one with everything it started, and reaping what is
left of one that died (a Python-backend stub outlives a killed tritonserver, deaf to SIGTERM).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

from hf2triton.util.runs import step_logger
from hf2triton.util.waiting import wait_until


def alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (dead, not yet reaped by its parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _stat(pid)[0] != "Z"


def _stat(pid: int) -> tuple[str, int]:
    """The state letter and process group of `pid` ("?", 0 when it cannot be read)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?", 0
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[2])


def running() -> dict[int, tuple[int, list[str]]]:
    """Every live process this one can read (zombies left out): its process group and its
    command line, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        state, pgrp = _stat(int(entry.name))
        if state in ("Z", "?"):
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        found[int(entry.name)] = (pgrp, [a.decode(errors="replace") for a in argv if a])
    return found


def group(pgid: int) -> dict[int, list[str]]:
    """The live processes of process group `pgid`, each with its command line."""
    return {pid: argv for pid, (pgrp, argv) in running().items() if pgrp == pgid}


def describe(argv: list[str]) -> str:
    """A process in a few words: its program's name and its first argument's last parts (a
    Python-backend stub names the model.py it runs)."""
    if not argv:
        return "?"
    first = ["/".join(Path(a).parts[-3:]) for a in argv[1:2]]
    return " ".join([Path(argv[0]).name, *first])


def spawn(
    cmd: list[str], log_file: Path, env: dict[str, str], cwd: str | None = None
) -> subprocess.Popen:
    """Start `cmd` in a session of its own (it keeps running after the caller ends, and its
    process group holds everything it starts), its output appended to `log_file`.

    A thread waits for it, so it is reaped the moment it dies: a killed tritonserver left as a
    zombie while its caller lived still answered kill(pid, 0), and its Python-backend stubs,
    which poll their parent that way, kept running for as long, holding open the connections
    the server had when they started (a client waiting on a load got no answer).
    """
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    return proc


def reap_group(pgid: int, what: str, grace_s: float = 2.0) -> dict[int, list[str]]:
    """Kill what is left of the process group of `what`, the dead process `pgid` that led it
    (SIGKILL: a Python-backend stub ignores SIGTERM), after `grace_s` for it to end on its own;
    returns what was reaped, and logs it in one line. Nothing while the leader lives.

    Only what that process started is hit: Linux gives no new process the number of a process
    group that still has members, so the group is the dead leader's.
    """
    if alive(pgid) or wait_until(lambda: not group(pgid), grace_s, interval_s=0.1):
        return {}
    left = group(pgid)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return {}
    wait_until(lambda: not group(pgid), 10, interval_s=0.1)
    if left:
        step_logger().warning(
            "reaped what %s (pid %d, dead) had left running: %s",
            what,
            pgid,
            "; ".join(f"pid {pid} {describe(argv)}" for pid, argv in sorted(left.items())),
        )
    return left


def stop_group(pid: int, timeout_s: float = 30, what: str = "the process") -> None:
    """Stop `what`, a process started in its own session, and everything it started (a
    tritonserver and its Python-backend stubs): SIGTERM to the group, SIGKILL if it still runs
    after `timeout_s`, and then SIGKILL to whatever of the group outlived it."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if not wait_until(lambda: not alive(pid), timeout_s, interval_s=0.2):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        wait_until(lambda: not alive(pid), 10, interval_s=0.2)
    reap_group(pid, what)
