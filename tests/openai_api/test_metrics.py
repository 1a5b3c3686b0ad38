"""hf2triton/openai_api/metrics.py: requests, errors and latency by route and model, as Prometheus
reads them on /metrics; each app counts its own."""

from __future__ import annotations

from hf2triton.openai_api.metrics import Metrics


def test_requests_errors_and_latency_are_counted_by_route_model_and_status():
    metrics = Metrics()
    metrics.observe("/v1/embeddings", "emb", 200, 0.02)
    metrics.observe("/v1/embeddings", "emb", 200, 0.3)
    metrics.observe("/v1/chat/completions", "gen", 400, 0.001)
    text = metrics.text().decode()
    assert (
        'hf2triton_openai_requests_total{model="emb",route="/v1/embeddings",status="200"} 2.0'
        in text
    )
    assert (
        'hf2triton_openai_errors_total{model="gen",route="/v1/chat/completions",status="400"} 1.0'
        in text
    )
    assert 'hf2triton_openai_errors_total{model="emb"' not in text  # a 200 is no error
    assert (
        'hf2triton_openai_request_seconds_bucket{le="0.025",model="emb",route="/v1/embeddings"} 1.0'
        in text
    )
    assert 'hf2triton_openai_request_seconds_count{model="emb",route="/v1/embeddings"} 2.0' in text


def test_two_apps_keep_their_own_counts():
    one, other = Metrics(), Metrics()
    one.observe("/v1/rerank", "rr", 200, 0.01)
    assert 'model="rr"' in one.text().decode()
    assert 'model="rr"' not in other.text().decode()
