"""hf2triton/clients/openai.py: a model version asked through the OpenAI-compatible API as the
smoke test and the watch ask it. The kind maps Triton's arrays onto its route and the answer
back; the key goes as a bearer token; a refusal raises the caller's error with the API's
message, an API that is down or failing upstream a retryable ServiceUnavailableError. A
stand-in HTTP server in this process plays the API."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from hf2triton.clients.openai import OpenAIApi, OpenAIInference
from hf2triton.clients.triton import Failure
from hf2triton.errors import ServiceUnavailableError, SmokeTestError
from hf2triton.kinds.embedding import EmbeddingConfig, EmbeddingKind
from hf2triton.spec import kind_for, load_spec
from tests.clients.stand_in import StandIn
from tests.conftest import ROOT

TEXTS = {"TEXT": np.array([[b"a"], [b"bc"]], np.object_)}
# The API may answer rows in any order: each carries the index of its input.
ANSWER = {
    "data": [{"index": 1, "embedding": [4.0, 5.0, 6.0]}, {"index": 0, "embedding": [1.0, 2.0, 3.0]}]
}


def client(port: int, key: str | None = "sk-1", version: str = "2") -> OpenAIInference:
    """The client as the smoke test builds it for the default MiniLM release: its real kind and
    a resolved config of that kind."""
    kind = kind_for(load_spec(ROOT / "releases" / "minilm-embedder.yaml"))
    cfg = EmbeddingConfig(pooling="mean", normalize=True, max_length=256)
    failure = Failure(SmokeTestError, "embed the smoke texts")
    return OpenAIInference(
        OpenAIApi(f"http://127.0.0.1:{port}/v1/", key), "emb", version, kind, cfg, failure
    )


def test_a_request_goes_through_the_kinds_route_with_the_key_and_comes_back_as_arrays():
    with StandIn({("POST", "/v1/embeddings"): (200, ANSWER)}) as api:
        session = client(api.port)
        out = session(TEXTS)
    assert isinstance(session.kind, EmbeddingKind)
    # The kind's own mapping: one row per text, in the order the texts were sent.
    assert out["EMBEDDING"].tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert out["EMBEDDING"].dtype == np.float32
    (_, _, headers, body) = api.seen[0]
    assert body == {"model": "emb:2", "input": ["a", "bc"]}
    assert headers["Authorization"] == "Bearer sk-1"
    assert len(session.latencies_ms) == 1


def test_a_refusal_raises_the_callers_error_with_the_apis_message():
    refused = {"error": {"message": "input: send text", "param": "input"}}
    with StandIn({("POST", "/v1/embeddings"): (400, refused)}) as api:
        with pytest.raises(SmokeTestError) as caught:
            client(api.port, key=None, version="")(TEXTS)
    assert str(caught.value).endswith("failed to embed the smoke texts: HTTP 400 input: send text")
    assert "Authorization" not in api.seen[0][2] and api.seen[0][3]["model"] == "emb"


@pytest.mark.parametrize("status", [502, 503, 504])
def test_an_api_failing_upstream_is_worth_a_retry(status):
    with StandIn({("POST", "/v1/embeddings"): (status, b"<html>bad gateway</html>")}) as api:
        with pytest.raises(ServiceUnavailableError) as caught:
            client(api.port)(TEXTS)
    assert f"HTTP {status}" in str(caught.value) and caught.value.retryable


def test_an_api_that_does_not_answer_is_unavailable_and_never_ready():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed: nothing listens there
    session = client(port)
    with pytest.raises(ServiceUnavailableError, match="did not answer \\(embed the smoke texts\\)"):
        session(TEXTS)
    with pytest.raises(ServiceUnavailableError, match="does not list emb:2 after 0s"):
        session.wait_ready(timeout_s=0.2)


def test_ready_once_the_api_lists_the_model():
    models = {"data": [{"id": "other"}, {"id": "emb"}]}
    with StandIn({("GET", "/v1/models"): (200, models)}) as api:
        client(api.port).wait_ready(timeout_s=5)
    with StandIn({("GET", "/v1/models"): (200, {"data": [{"id": "other"}]})}) as api:
        with pytest.raises(ServiceUnavailableError):
            client(api.port).wait_ready(timeout_s=0.3)
