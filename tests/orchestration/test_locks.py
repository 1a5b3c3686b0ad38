"""One run of a release at a time in a home: a second run waits for the first, and when the wait
runs out stops with a retryable ReleaseBusyError naming the run it waited for; a lock goes with
its process, so a killed run leaves none behind."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from hf2triton.errors import EnvironmentSetupError, ReleaseBusyError, is_retryable
from hf2triton.orchestration.locks import (
    DEFAULT_LOCK_WAIT_S,
    LOCK_WAIT_ENV,
    describe_holder,
    lock_path,
    lock_wait_s,
    read_holder,
    release_lock,
)


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("raw, wait", [("", DEFAULT_LOCK_WAIT_S), ("0", 0.0), (" 2.5 ", 2.5)])
def test_lock_wait_from_the_environment(monkeypatch, raw, wait):
    monkeypatch.setenv(LOCK_WAIT_ENV, raw)
    assert lock_wait_s() == wait


@pytest.mark.parametrize("raw", ["-1", "soon", "inf", "nan"])
def test_a_bad_lock_wait_is_refused_with_the_fix(monkeypatch, raw):
    monkeypatch.setenv(LOCK_WAIT_ENV, raw)
    with pytest.raises(EnvironmentSetupError, match=f"{LOCK_WAIT_ENV}='{raw}': give the seconds"):
        lock_wait_s()


def test_the_holder_is_named_while_it_runs_and_forgotten_after(home):
    with release_lock("tiny", wait_s=0) as path:
        assert path == lock_path("tiny") and path.parent == home / "locks"
        info = read_holder(path)
        assert info is not None and info["pid"] == os.getpid() and info["flow_run"] is None
        assert describe_holder(info).startswith(f"pid {os.getpid()} since ")
    assert read_holder(path) is None  # a waiter must not name a run that ended
    with release_lock("tiny", wait_s=0):  # free again
        pass


def test_a_second_run_that_cannot_wait_is_busy_and_retryable(home):
    with release_lock("tiny", wait_s=0):
        with pytest.raises(ReleaseBusyError) as info:
            with release_lock("tiny", wait_s=0.3):
                pass
    msg = str(info.value)
    assert f"release 'tiny' is still being run by pid {os.getpid()}" in msg
    assert LOCK_WAIT_ENV in msg and str(lock_path("tiny")) in msg
    assert is_retryable(info.value)
    # Another release is not held up.
    with release_lock("other", wait_s=0):
        pass


def test_a_second_run_waits_for_the_first_and_goes_on(home):
    order: list[str] = []
    held = threading.Event()

    def first():
        with release_lock("tiny", wait_s=0):
            held.set()
            time.sleep(0.5)
            order.append("first done")

    t = threading.Thread(target=first)
    t.start()
    held.wait(10)
    with release_lock("tiny", wait_s=30):
        order.append("second runs")
    t.join()
    assert order == ["first done", "second runs"]


def test_a_killed_run_leaves_no_lock(home):
    code = (
        "import time; from hf2triton.orchestration.locks import release_lock\n"
        "with release_lock('tiny', wait_s=0):\n"
        "    print('held', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env={**os.environ}
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(ReleaseBusyError, match=f"pid {proc.pid}"):
            with release_lock("tiny", wait_s=0):
                pass
    finally:
        proc.kill()
        proc.wait()
    with release_lock("tiny", wait_s=5):
        pass


def test_describe_holder():
    assert describe_holder(None) == "another process (it has not written which yet)"
    info = {"pid": 7, "host": "elsewhere", "since": "2025-01-02 03:04:05+00:00", "flow_run": "x"}
    assert describe_holder(info) == (
        "pid 7 on elsewhere (flow run 'x') since 2025-01-02 03:04:05+00:00"
    )
