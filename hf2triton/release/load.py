"""Closed-loop load on a served model: N concurrent clients on one asyncio loop, each sending its
next request when its last one was answered, for a time or a count of answers; the latency of
every request answered inside the measured window, and the failures. The configuration search
(hf2triton.release.tuning) and the benchmarks drive Triton with it.

    result = asyncio.run(closed_loop(TritonGrpc(url, model), requests, clients=16,
                                     duration_s=10, warmup_s=2))
    result.rps, result.p99_ms, result.errors
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

Payload = TypeVar("Payload")
# One request: send the payload, return when answered, raise when it failed.
Call = Callable[[Payload], Awaitable[Any]]

# Spreads the clients' starting points over the payloads (a prime: no two clients in step).
STRIDE = 7919
ERROR_PAUSE_S = 0.05  # after a failed request: a refusing server is not hammered in a spin
KEEP_FAILURES = 20


class Window(Protocol):
    """Told when the measured window opens and closes (a CPU meter, for one)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class LoadResult:
    clients: int
    seconds: float  # the measured window's length
    latencies_ms: list[float] = field(default_factory=list)  # each answered inside the window
    answered_at_s: list[float] = field(default_factory=list)  # when, seconds into the window
    errors: int = 0  # requests that failed inside the window
    warmup_errors: int = 0  # requests that failed before it
    failures: list[str] = field(default_factory=list)  # the first few, "12.3s Error: message"

    @property
    def requests(self) -> int:
        return len(self.latencies_ms)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        """The q-th percentile latency; NaN when nothing was answered."""
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    @property
    def p50_ms(self) -> float:
        return self.percentile_ms(50)

    @property
    def p90_ms(self) -> float:
        return self.percentile_ms(90)

    @property
    def p99_ms(self) -> float:
        return self.percentile_ms(99)

    @property
    def mean_ms(self) -> float:
        return float(np.mean(self.latencies_ms)) if self.latencies_ms else float("nan")

    def summary(self) -> dict[str, Any]:
        """The figures, without the per-request lists."""
        return {
            "clients": self.clients,
            "requests": self.requests,
            "errors": self.errors,
            "warmup_errors": self.warmup_errors,
            "seconds": round(self.seconds, 3),
            "rps": self.rps,
            "p50_ms": self.p50_ms,
            "p90_ms": self.p90_ms,
            "p99_ms": self.p99_ms,
            "mean_ms": self.mean_ms,
            "first_error": self.failures[0] if self.failures else None,
        }


# Nine parameters by design: a load generator's knobs (as wrk's or AIPerf's flags), all but the
# first four with defaults; the configuration search, the soak and the benchmarks each set a few.
async def closed_loop(
    call: Call[Payload],
    payloads: Sequence[Payload],
    clients: int,
    duration_s: float,
    warmup_s: float = 0.0,
    max_requests: int | None = None,
    request_timeout_s: float = 30.0,
    window: Window | None = None,
    max_errors: int = 1000,
) -> LoadResult:
    """Run `clients` closed-loop clients of `call` over `payloads` (each client from its own
    place in them, in turn).

    Requests answered inside the measured window count, whenever they were sent (at 200 clients
    a request waits a good part of a second; dropping those sent before the window would
    undercount throughput); their latency is send-to-answer. The window opens after `warmup_s`
    and once every client has had an answer (no later than 5 x `warmup_s`: a slow server takes
    seconds for one round), and closes after `duration_s`, after `max_requests` answers in it,
    or after more than `max_errors` failures (a dead server: stop rather than spin).
    """
    if clients < 1 or not payloads or duration_s <= 0:
        raise ValueError(
            f"closed_loop needs clients >= 1 ({clients}), payloads "
            f"({len(payloads)}) and duration_s > 0 ({duration_s})"
        )
    run = _Run(
        call,
        payloads,
        LoadResult(clients=clients, seconds=0.0),
        max_requests,
        request_timeout_s,
        max_errors,
    )
    tasks = [asyncio.create_task(run.client(i)) for i in range(clients)]
    try:
        if warmup_s > 0:
            await run.warm_up(clients, warmup_s)
        if window is not None:
            window.start()
        run.opened.append(run.loop.time())
        try:
            await asyncio.wait_for(run.stop.wait(), duration_s)
        except TimeoutError:
            pass
        run.closed.append(run.loop.time())
        if window is not None:
            window.stop()
        run.stop.set()
        # In-flight requests finish (bounded), so the server is idle for whatever runs next.
        await asyncio.wait(tasks, timeout=request_timeout_s)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    run.result.seconds = run.closed[0] - run.opened[0]
    return run.result


class _Run:
    """The clients' shared state: when the measured window opened and closed, what was
    answered inside it, and the failures."""

    def __init__(
        self,
        call: Call[Any],
        payloads: Sequence[Any],
        result: LoadResult,
        max_requests: int | None,
        request_timeout_s: float,
        max_errors: int,
    ):
        self.call, self.payloads, self.result = call, payloads, result
        self.max_requests, self.request_timeout_s = max_requests, request_timeout_s
        self.max_errors = max_errors
        self.loop = asyncio.get_running_loop()
        self.stop = asyncio.Event()
        self.opened: list[float] = []  # the window's start, once open
        self.closed: list[float] = []
        self.answered = 0
        self.started = self.loop.time()

    async def warm_up(self, clients: int, warmup_s: float) -> None:
        """`warmup_s`, then until every client has had an answer (at most 5 x `warmup_s`)."""
        await asyncio.sleep(warmup_s)
        while (
            self.answered < clients
            and self.loop.time() - self.started < 5 * warmup_s
            and not self.stop.is_set()
        ):
            await asyncio.sleep(0.1)

    def fail(self, at: float, exc: Exception) -> None:
        result = self.result
        if self.opened and not self.closed:
            result.errors += 1
        elif not self.opened:
            result.warmup_errors += 1
        if len(result.failures) < KEEP_FAILURES:
            since = at - (self.opened[0] if self.opened else self.started)
            result.failures.append(f"{since:.1f}s {type(exc).__name__}: {exc}"[:300])
        if result.errors + result.warmup_errors > self.max_errors:
            self.stop.set()

    async def client(self, i: int) -> None:
        k = i * STRIDE
        while not self.stop.is_set():
            payload = self.payloads[k % len(self.payloads)]
            k += 1
            t0 = self.loop.time()
            try:
                await asyncio.wait_for(self.call(payload), self.request_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is counted and one kept
                self.fail(t0, exc)
                await asyncio.sleep(ERROR_PAUSE_S)
                continue
            t1 = self.loop.time()
            self.answered += 1
            if self.opened and not self.closed:
                self.result.latencies_ms.append((t1 - t0) * 1000)
                self.result.answered_at_s.append(t1 - self.opened[0])
                if self.max_requests is not None and self.result.requests >= self.max_requests:
                    self.stop.set()
