"""What the pipeline's Prefect tasks share: the retry condition retries only what can succeed on a
second try, the retry settings follow HF2TRITON_RETRY_DELAYS, steps log to the run's logger
inside a run, and a reused step says so."""

from __future__ import annotations

import importlib
import logging

import pytest
from prefect import flow, task

from hf2triton.errors import ServiceUnavailableError, SmokeTestError
from hf2triton.util import runs
from hf2triton.util.runs import (
    NO_PREFECT_CACHE,
    RETRY_TRANSIENT,
    in_prefect_run,
    note_reuse,
    retry_transient,
    step_logger,
)


class _State:
    def __init__(self, exc: BaseException | None):
        self.exc = exc

    def result(self):
        if self.exc is not None:
            raise self.exc
        return 1


@pytest.mark.parametrize(
    "exc, retried",
    [
        (ServiceUnavailableError("MLflow answered 503"), True),
        (ConnectionRefusedError("refused"), True),
        (SmokeTestError("cosine 0.2"), False),
        (ValueError("bad"), False),
        (None, False),  # a state without an error needs no retry
    ],
)
def test_retry_condition_retries_only_transient_failures(exc, retried):
    assert retry_transient(None, None, _State(exc)) is retried


@pytest.fixture()
def reread(monkeypatch):
    """The module read again under a given HF2TRITON_RETRY_DELAYS (it reads it once, at import);
    read back as it was after the test."""

    def read(delays: str | None):
        if delays is None:
            monkeypatch.delenv("HF2TRITON_RETRY_DELAYS", raising=False)
        else:
            monkeypatch.setenv("HF2TRITON_RETRY_DELAYS", delays)
        return importlib.reload(runs).RETRY_TRANSIENT

    yield read
    monkeypatch.undo()
    importlib.reload(runs)


def test_retry_delays_follow_the_environment(reread):
    default = reread(None)
    assert (default["retries"], default["retry_delay_seconds"]) == (3, [2.0, 10.0, 30.0])
    short = reread("0.5, 1")
    assert (short["retries"], short["retry_delay_seconds"]) == (2, [0.5, 1.0])
    with pytest.raises(ValueError, match="HF2TRITON_RETRY_DELAYS='2,soon': give seconds"):
        reread("2,soon")


def test_retry_and_cache_settings_are_prefect_task_options():
    assert RETRY_TRANSIENT["retries"] == len(RETRY_TRANSIENT["retry_delay_seconds"])
    assert RETRY_TRANSIENT["retry_condition_fn"] is retry_transient
    # Prefect accepts them as they are.
    step = task(**RETRY_TRANSIENT, **NO_PREFECT_CACHE)(lambda: 1)
    assert step.retries == RETRY_TRANSIENT["retries"]
    assert step.persist_result is False


def test_outside_a_run_steps_log_to_the_package_logger(caplog):
    assert not in_prefect_run()
    assert step_logger() is logging.getLogger("hf2triton")
    with caplog.at_level(logging.INFO, logger="hf2triton"):
        note_reuse("export", {"reused": True})
        note_reuse("gate", {"reused": False})
    assert [r.getMessage() for r in caplog.records] == [
        "export: reused the finished output of an earlier run (same inputs)"
    ]


def test_inside_a_run_steps_log_to_the_run_logger():
    @task
    def inside() -> tuple[bool, str]:
        return in_prefect_run(), type(step_logger()).__name__

    @flow
    def run() -> tuple[bool, str, bool, str]:
        return (in_prefect_run(), type(step_logger()).__name__, *inside())

    in_flow, flow_logger, in_task, task_logger = run()
    assert in_flow and in_task
    # Prefect's run logger (an adapter carrying the run's id), not the package's own.
    assert flow_logger == task_logger == "PrefectLogAdapter"
