"""hf2triton.util.isolated: large models' exports and PyTorch references run in a child process
(its memory returned to the system when it ends); what it raises is raised in the release, a
child that dies is named with how it died, and small work stays in the release's process."""

from __future__ import annotations

import os
import signal

import pytest

from hf2triton.errors import ExportError, SpecError, WorkerDiedError
from hf2triton.util.isolated import ENV, run_isolated


def _pid_and(value: int) -> tuple[int, int]:
    return os.getpid(), value * 2


def _raises(message: str) -> None:
    raise ExportError(message)


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_work_over_the_size_runs_in_a_child_and_answers(monkeypatch):
    monkeypatch.setenv(ENV, "1")  # 1 MB
    pid, doubled = run_isolated("test", 2 * 2**20, _pid_and, 21)
    assert doubled == 42
    assert pid != os.getpid()


def test_work_under_the_size_stays_in_this_process(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)  # 256 MB by default
    pid, _ = run_isolated("test", 10 * 2**20, _pid_and, 1)
    assert pid == os.getpid()


def test_what_the_child_raises_is_raised_here_with_its_type_and_text(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    with pytest.raises(ExportError, match="the graph disagrees"):
        run_isolated("test", 0, _raises, "the graph disagrees")


def test_a_child_killed_by_the_kernel_is_named_with_how_it_died(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    with pytest.raises(WorkerDiedError) as info:
        run_isolated("ONNX export", 0, _killed)
    text = str(info.value)
    assert "the ONNX export process ended without an answer" in text
    assert "SIGKILL" in text and "out of memory" in text and ENV in text


def test_a_setting_that_is_not_a_number_says_what_to_set(monkeypatch):
    monkeypatch.setenv(ENV, "lots")
    with pytest.raises(SpecError, match=f"{ENV}='lots' is not a number of MB"):
        run_isolated("test", 0, _pid_and, 1)
