"""The closed-loop load generator (hf2triton.release.load) on a call of our own: what it counts,
when it stops, and what it keeps of failures. Driving a real Triton with it:
tests/release/test_tuning.py."""

from __future__ import annotations

import asyncio

import pytest

from hf2triton.release.load import closed_loop


class Service:
    """An in-process stand-in for a served model: answers after a short wait, refuses "bad"
    payloads, and remembers how many requests it had open at once."""

    def __init__(self, fail_first: int = 0):
        self.open = self.most_open = self.seen = 0
        self.fail_first = fail_first

    async def __call__(self, payload: str) -> str:
        self.seen += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await asyncio.sleep(0.002)
            if payload == "bad" or self.seen <= self.fail_first:
                raise ValueError(f"refused {payload}")
            return payload.upper()
        finally:
            self.open -= 1


def test_clients_are_concurrent_and_a_request_count_ends_the_window():
    service = Service()
    found = asyncio.run(
        closed_loop(service, ["a", "b", "c"], clients=8, duration_s=60, max_requests=200)
    )
    assert service.most_open == 8  # each client one request at a time, all at once
    assert 200 <= found.requests <= 208  # the count ended it, long before 60 s
    assert found.errors == 0 and found.rps > 0
    assert len(found.answered_at_s) == found.requests
    assert all(t >= 0 for t in found.answered_at_s)
    assert found.p50_ms <= found.p99_ms


def test_failures_are_counted_and_described_and_never_counted_as_answers():
    service = Service()
    found = asyncio.run(
        closed_loop(service, ["ok", "bad"], clients=2, duration_s=60, max_requests=50)
    )
    assert found.requests >= 50 and found.errors > 0
    assert "ValueError: refused bad" in found.failures[0]
    assert found.summary()["first_error"] == found.failures[0]


def test_warmup_failures_are_kept_apart_from_the_window():
    service = Service(fail_first=3)  # a server still starting refuses its first requests
    found = asyncio.run(
        closed_loop(service, ["ok"], clients=1, duration_s=60, warmup_s=0.3, max_requests=20)
    )
    assert (found.warmup_errors, found.errors) == (3, 0)
    assert found.requests >= 20


def test_a_dead_service_ends_the_run_instead_of_spinning():
    async def dead(payload: str) -> None:
        raise ConnectionError("connection refused")

    found = asyncio.run(closed_loop(dead, ["x"], clients=4, duration_s=600, max_errors=20))
    assert found.requests == 0 and found.errors > 20
    assert found.p99_ms != found.p99_ms  # NaN: nothing was answered


def test_nothing_to_send_is_refused():
    with pytest.raises(ValueError, match="payloads"):
        asyncio.run(closed_loop(Service(), [], clients=1, duration_s=1))
