"""hf2triton/openai_api/limits.py: the middleware in front of every route. A request without a
valid key (when keys are set) is a 401, a body over the limit a 413 (told by its length, or
counted as it streams in), /health and /metrics need no key, and every other request is
counted by route, model and status. Driven through the app with test_routes' stand-in."""

from __future__ import annotations

import hashlib

from tests.openai_api.test_routes import client, error_of

KEYS = ("sk-one", "sk-two")


def test_any_of_the_keys_opens_the_api_and_nothing_else_does():
    api, _ = client(key_hashes=tuple(hashlib.sha256(k.encode()).hexdigest() for k in KEYS))
    body = {"model": "emb", "input": "x"}
    for key in KEYS:
        assert (
            api.post(
                "/v1/embeddings", json=body, headers={"Authorization": f"Bearer {key}"}
            ).status_code
            == 200
        )
    for headers in ({}, {"Authorization": "Bearer sk-three"}, {"Authorization": "Basic sk-one"}):
        error = error_of(api.post("/v1/embeddings", json=body, headers=headers), 401)
        assert (
            error["code"] == "invalid_api_key" and "Authorization: Bearer <key>" in error["message"]
        )
        assert "sk-" not in error["message"]  # no key is ever echoed
    assert api.get("/health").status_code == 200 and api.get("/metrics").status_code == 200


def test_a_body_over_the_limit_is_a_413_whether_its_length_is_told_or_not():
    api, fake = client()  # max_body 64 KiB
    big = {"model": "emb", "input": "x" * (1 << 16)}
    error = error_of(api.post("/v1/embeddings", json=big), 413)
    assert (
        error["code"] == "request_too_large"
        and "over this API's limit of 65536" in error["message"]
    )

    def chunks(head: bytes):  # no Content-Length: counted as it comes
        yield head
        for _ in range(40):
            yield b"x" * 2048
        yield b'"]}'

    # Whether the route reads its own JSON (rerank) or FastAPI parses the body (embeddings).
    for route, head in (
        ("/v1/rerank", b'{"model": "rr", "query": "q", "documents": ["'),
        ("/v1/embeddings", b'{"model": "emb", "input": ["'),
    ):
        streamed = api.post(
            route, content=chunks(head), headers={"Content-Type": "application/json"}
        )
        error = error_of(streamed, 413)
        assert (
            error["code"] == "request_too_large"
            and "over this API's limit of 65536 bytes" in error["message"]
        ), route
    assert fake.batches == []  # the embeddings never reached the model


def test_each_request_is_counted_by_route_model_and_status_but_health_is_not():
    api, _ = client()
    api.post("/v1/embeddings", json={"model": "emb", "input": "x"})
    api.post("/v1/embeddings", json={"model": "nope", "input": "x"})
    api.get("/health")
    text = api.get("/metrics").text
    assert (
        'hf2triton_openai_requests_total{model="emb",route="/v1/embeddings",status="200"} 1.0'
        in text
    )
    assert (
        'hf2triton_openai_errors_total{model="nope",route="/v1/embeddings",status="404"} 1.0'
        in text
    )
    assert 'route="/health"' not in text and 'route="/metrics"' not in text
