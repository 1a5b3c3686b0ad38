"""The API's own Prometheus metrics: requests, errors and latency by route and model."""

from __future__ import annotations


class Metrics:
    """Requests, errors and latency by route and model, on /metrics (Prometheus)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hf2triton_openai_requests",
            "Requests answered",
            ["route", "model", "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "hf2triton_openai_errors",
            "Requests answered with an error",
            ["route", "model", "status"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "hf2triton_openai_request_seconds",
            "Time to answer a request (a stream: to its end)",
            ["route", "model"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )

    def observe(self, route: str, model: str, status: int, seconds: float) -> None:
        self.requests.labels(route, model, str(status)).inc()
        if status >= 400:
            self.errors.labels(route, model, str(status)).inc()
        self.seconds.labels(route, model).observe(seconds)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
