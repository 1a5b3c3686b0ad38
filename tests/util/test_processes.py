"""Processes in a session of their own, and what a dead one leaves: a leader that starts a child
deaf to SIGTERM (as a tritonserver starts its Python-backend stubs), killed, stopped, reaped."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from hf2triton.util.processes import alive, group, reap_group, spawn, stop_group
from hf2triton.util.waiting import wait_until

# A leader that starts a child ignoring SIGTERM and then waits; SIGTERM ends the leader only.
LEADER = (
    "import signal, subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'])\n"
    "time.sleep(300)\n"
)


class Heard(logging.Handler):
    """The messages logged to the logger it is added to (caplog's handler on the root logger
    does not see them in every order the suite runs in)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture()
def leader(tmp_path: Path):
    """A leader and its deaf child, started by `spawn`; whatever a test leaves of its group is
    killed after it."""
    proc = spawn([sys.executable, "-c", LEADER], tmp_path / "leader.log", dict(os.environ))
    assert wait_until(lambda: len(group(proc.pid)) == 2, 30, interval_s=0.1), group(proc.pid)
    yield proc
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_killed_leader_is_reaped_at_once_but_its_child_lives_on_until_reaped(leader, caplog):
    """kill -9 of the leader: the thread `spawn` started reaps it (no zombie is left to answer
    kill(pid, 0)); its child, deaf to SIGTERM, runs on until `reap_group` kills it, and the
    log names it."""
    child = next(pid for pid in group(leader.pid) if pid != leader.pid)
    os.kill(leader.pid, signal.SIGKILL)
    assert wait_until(lambda: not Path(f"/proc/{leader.pid}").exists(), 5, interval_s=0.05)
    assert leader.wait(5) == -signal.SIGKILL
    assert alive(child) and group(leader.pid).keys() == {child}
    heard = Heard()
    logger = logging.getLogger("hf2triton")  # step_logger's outside a Prefect run
    logger.addHandler(heard)
    try:
        with caplog.at_level(logging.WARNING, logger="hf2triton"):
            reaped = reap_group(leader.pid, "the leader", grace_s=0.5)
    finally:
        logger.removeHandler(heard)
    assert reaped.keys() == {child}
    assert not alive(child) and not group(leader.pid)
    assert heard.lines == [
        f"reaped what the leader (pid {leader.pid}, dead) had left running: pid {child} python -c"
    ]


def test_a_live_leaders_group_is_never_reaped(leader):
    assert reap_group(leader.pid, "the leader", grace_s=0) == {}
    assert len(group(leader.pid)) == 2


def test_stop_group_stops_what_outlives_the_leaders_sigterm(leader):
    """SIGTERM ends the leader; its child ignores it and is killed after, not left running."""
    child = next(pid for pid in group(leader.pid) if pid != leader.pid)
    stop_group(leader.pid, timeout_s=10, what="the leader")
    assert not alive(leader.pid) and not alive(child)
    assert leader.wait(5) == -signal.SIGTERM
