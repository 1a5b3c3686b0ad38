"""Triton's Prometheus metrics (its metrics port, /metrics) read per model version, and the
figures of the interval between two reads: request rate, failure rate, p50/p99 latency, mean
queue and compute time. Parsed with prometheus_client's text parser."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from hf2triton.clients.triton import metrics_text

# Triton's per-version counters (cumulative since the version loaded) that the watch reads.
COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
)
# Request latency quantiles over Triton's sliding window (--metrics-config
# summary_latencies=true, which hf2triton.targets.triton_local starts the server with).
SUMMARY = "nv_inference_request_summary_us"


@dataclass
class Scrape:
    """One read of a metrics endpoint: {(model, version): {counter: value}}, and quantiles."""

    at: float
    counters: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    quantiles: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)


def parse(text: str, at: float | None = None) -> Scrape:
    """Triton's /metrics text as per-version counters (failures summed over their reasons)."""
    from prometheus_client.parser import text_string_to_metric_families

    scrape = Scrape(at=time.time() if at is None else at)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if "model" not in labels or "version" not in labels:
                continue
            key = (labels["model"], labels["version"])
            # The parser names counter samples <name>_total; Triton's own names have no suffix.
            name = sample.name.removesuffix("_total") if family.type == "counter" else sample.name
            if name in COUNTERS:
                per = scrape.counters.setdefault(key, {})
                per[name] = per.get(name, 0.0) + sample.value
            elif sample.name == SUMMARY and "quantile" in labels:
                scrape.quantiles.setdefault(key, {})[labels["quantile"]] = sample.value
    return scrape


def read(metrics_url: str, timeout_s: float = 10) -> Scrape:
    """Scrape `metrics_url` (http://host:port/metrics)."""
    return parse(metrics_text(metrics_url, timeout_s))


def figures(before: Scrape | None, after: Scrape, model: str, version: str) -> dict[str, Any]:
    """What `version` of `model` did between two scrapes (since it loaded, without `before`).
    Counters that went down (the version was reloaded) count from zero."""
    now = after.counters.get((model, version), {})
    then = before.counters.get((model, version), {}) if before else {}

    def delta(name: str) -> float:
        a, b = now.get(name, 0.0), then.get(name, 0.0)
        return a - b if a >= b else a

    ok, failed = delta("nv_inference_request_success"), delta("nv_inference_request_failure")
    requests = ok + failed
    seconds = after.at - before.at if before else None
    q = after.quantiles.get((model, version), {})
    out: dict[str, Any] = {
        "model": model,
        "version": version,
        "requests": int(requests),
        "failed": int(failed),
        "request_rate": round(requests / seconds, 3) if seconds else None,
        "failure_rate": round(failed / requests, 4) if requests else 0.0,
        "p50_ms": _ms(q.get("0.5")),
        "p99_ms": _ms(q.get("0.99")),
        "queue_ms": round(delta("nv_inference_queue_duration_us") / ok / 1000, 3) if ok else None,
        "compute_ms": round(delta("nv_inference_compute_infer_duration_us") / ok / 1000, 3)
        if ok
        else None,
        "loaded": (model, version) in after.counters,
    }
    return out


def _ms(us: float | None) -> float | None:
    # A quantile over an empty window is NaN in Triton's summary.
    return None if us is None or math.isnan(us) else round(us / 1000, 3)
