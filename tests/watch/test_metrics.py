"""Triton's Prometheus metrics read per model version, and the figures of the interval between two
reads: request and failure rates, latency quantiles, queue and compute time per request."""

from __future__ import annotations

import math

from hf2triton.watch.metrics import Scrape, figures, parse


def _text(ok: float, failed: tuple[float, float], us: float, p99: float = 12000.0) -> str:
    """A /metrics page as Triton writes it (two failure reasons, another model beside)."""
    return f"""\
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="emb",version="2"}} {ok}
nv_inference_request_success{{model="emb",version="1"}} 50
nv_inference_request_success{{model="other",version="2"}} 999
# HELP nv_inference_request_failure Number of failed inference requests
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{{model="emb",reason="BACKEND",version="2"}} {failed[0]}
nv_inference_request_failure{{model="emb",reason="REJECTED",version="2"}} {failed[1]}
# HELP nv_inference_request_duration_us Cumulative inference request duration
# TYPE nv_inference_request_duration_us counter
nv_inference_request_duration_us{{model="emb",version="2"}} {us}
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{model="emb",version="2"}} {us / 10}
# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{{model="emb",version="2"}} {us / 2}
# HELP nv_inference_request_summary_us Summary of inference request duration
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us_count{{model="emb",version="2"}} {ok}
nv_inference_request_summary_us_sum{{model="emb",version="2"}} {us}
nv_inference_request_summary_us{{model="emb",version="2",quantile="0.5"}} 4000
nv_inference_request_summary_us{{model="emb",version="2",quantile="0.99"}} {p99}
# HELP nv_gpu_utilization GPU utilization rate
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{{gpu_uuid="GPU-1"}} 0.5
"""


def test_parse_reads_each_versions_counters_summing_failure_reasons():
    scrape = parse(_text(ok=100, failed=(3, 2), us=500_000), at=10.0)
    assert scrape.at == 10.0
    assert scrape.counters[("emb", "2")] == {
        "nv_inference_request_success": 100.0,
        "nv_inference_request_failure": 5.0,
        "nv_inference_request_duration_us": 500_000.0,
        "nv_inference_queue_duration_us": 50_000.0,
        "nv_inference_compute_infer_duration_us": 250_000.0,
    }
    assert scrape.counters[("other", "2")] == {"nv_inference_request_success": 999.0}
    assert scrape.quantiles[("emb", "2")] == {"0.5": 4000.0, "0.99": 12000.0}
    assert set(scrape.counters) == {("emb", "2"), ("emb", "1"), ("other", "2")}  # no GPU gauge


def test_figures_of_the_interval_between_two_reads():
    before = parse(_text(ok=100, failed=(3, 2), us=500_000), at=10.0)
    after = parse(_text(ok=290, failed=(10, 5), us=1_450_000, p99=15500), at=20.0)
    got = figures(before, after, "emb", "2")
    assert got == {
        "model": "emb",
        "version": "2",
        "requests": 200,  # 190 answered, 10 failed in those 10 s
        "failed": 10,
        "request_rate": 20.0,
        "failure_rate": 0.05,
        "p50_ms": 4.0,
        "p99_ms": 15.5,
        "queue_ms": 0.5,  # 95 ms of queueing over 190 answered requests
        "compute_ms": 2.5,
        "loaded": True,
    }


def test_without_an_earlier_read_the_figures_count_from_the_load():
    got = figures(None, parse(_text(ok=100, failed=(0, 0), us=200_000)), "emb", "2")
    assert got["requests"] == 100 and got["failure_rate"] == 0.0
    assert got["request_rate"] is None  # no interval to divide by
    assert got["compute_ms"] == 1.0


def test_a_reloaded_version_counts_from_zero():
    before = parse(_text(ok=1000, failed=(0, 0), us=1_000_000), at=0.0)
    after = parse(_text(ok=40, failed=(2, 0), us=84_000), at=10.0)  # counters went down
    got = figures(before, after, "emb", "2")
    assert (got["requests"], got["failed"], got["request_rate"]) == (42, 2, 4.2)


def test_a_version_not_served_and_an_empty_window():
    after = parse(_text(ok=0, failed=(0, 0), us=0, p99=math.nan), at=5.0)
    gone = figures(Scrape(at=0.0), after, "emb", "7")
    assert gone["loaded"] is False and gone["requests"] == 0 and gone["failure_rate"] == 0.0
    assert gone["queue_ms"] is None and gone["p99_ms"] is None
    idle = figures(None, after, "emb", "2")
    assert idle["loaded"] is True and idle["p99_ms"] is None  # NaN quantile: no requests
