"""What the pipeline's Prefect tasks share: which failures are worth a second try, no Prefect
result cache (reuse is by content), and the logger of the run a step runs in."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from prefect.cache_policies import NO_CACHE

from hf2triton.errors import is_retryable


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry condition: retry only errors that can succeed on a second try."""
    try:
        state.result()
    except BaseException as exc:  # noqa: BLE001 - classified, not swallowed
        return is_retryable(exc)
    return False


def step_logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The Prefect run logger inside a run, else this package's logger."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("hf2triton")


def in_prefect_run() -> bool:
    """True inside a flow or task run (artifacts then attach to it)."""
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _delays() -> list[float]:
    raw = os.environ.get("HF2TRITON_RETRY_DELAYS", "2,10,30")
    try:
        return [float(d) for d in raw.split(",") if d.strip()]
    except ValueError:
        raise ValueError(
            f"HF2TRITON_RETRY_DELAYS={raw!r}: give seconds separated by commas, e.g. 2,10,30"
        ) from None


RETRY_DELAYS = _delays()
# For steps that talk to a server or the network. Everything else fails fast.
RETRY_TRANSIENT: dict[str, Any] = {
    "retries": len(RETRY_DELAYS),
    "retry_delay_seconds": RETRY_DELAYS,
    "retry_condition_fn": retry_transient,
}
# Reuse across runs is by content (hf2triton.util.workspace.cached_step), not Prefect's cache.
NO_PREFECT_CACHE: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}


def note_reuse(step: str, result: Mapping[str, Any]) -> None:
    """Say in the log when a step found its finished output of an earlier run (same inputs)."""
    if result.get("reused"):
        step_logger().info("%s: reused the finished output of an earlier run (same inputs)", step)
