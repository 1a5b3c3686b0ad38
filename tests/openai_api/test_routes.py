"""The API's routers in-process (hf2triton/openai_api/app.py's create_app, through FastAPI's
TestClient): routing, validation, OpenAI's error object, keys, metrics and the streaming framing.
`FakeTriton` stands in for Triton (it implements state.TritonClient) only to test these in-process;
tests/openai_api/test_app.py covers the real server, a real Triton and a real release."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hf2triton.openai_api.app import create_app
from hf2triton.openai_api.errors import bad_request, not_found
from hf2triton.openai_api.state import TritonClient
from hf2triton.openai_api.triton import Model

MODELS = (
    Model("emb", "1", "embedding", 2, ("EMBEDDING", "TOKENS"), 100, width=4),
    Model("gen", "3", "text_generation", 0, ("text_output", "output_ids", "finish_reason"), 100),
    Model("rr", "1", "reranking", 0, ("SCORES",), 100),
    Model("cls", "1", "classification", 0, ("LABEL", "SCORES"), 100, labels=("neg", "pos")),
)
PIECES = ("Hel", "lo", " there")
KEY = "sk-right"
JSON = {"Content-Type": "application/json"}


class FakeTriton:
    """A Triton serving MODELS: an embedder whose vector starts with the text's length, a
    generator that streams PIECES, a reranker scoring a passage by its length, a classifier."""

    served: tuple[Model, ...] = MODELS

    def __init__(self) -> None:
        self.batches: list[int] = []  # the texts in each embedding request sent
        self.closed = False

    async def live(self) -> bool:
        return True

    async def models(self) -> list[Model]:
        return list(self.served)

    async def model(self, name: str, kinds: tuple[str, ...], route: str) -> Model:
        found = next((m for m in self.served if m.name == name), None)
        if found is None:
            raise not_found(name)
        if found.kind not in kinds:
            raise bad_request(f"The model '{name}' is a {found.kind} model", param="model")
        return found

    async def infer(
        self, model: Model, arrays: dict[str, np.ndarray], prompt_param: str = "input"
    ) -> dict[str, np.ndarray]:
        if model.kind == "embedding":
            texts = [row[0].decode() for row in arrays["TEXT"]]
            self.batches.append(len(texts))
            return {
                "EMBEDDING": np.array([[len(t), 1, 2, 3] for t in texts], np.float32),
                "TOKENS": np.array([[len(t.split()) + 2] for t in texts], np.int32),
            }
        if model.kind == "reranking":
            return {"SCORES": np.array([[float(len(p)) for p in arrays["PASSAGES"][0]]])}
        return {"SCORES": np.array([[0.2, 0.8]] * len(arrays["TEXT"]), np.float32)}

    async def stream(
        self, model: Model, arrays: dict[str, np.ndarray], prompt_param: str = "prompt"
    ) -> AsyncIterator[dict[str, Any]]:
        streamed = bool(arrays["stream"][0][0])  # else one answer, the whole text
        for i, piece in enumerate(PIECES if streamed else ()):
            yield {
                "text_output": np.array([piece.encode()], np.object_),
                "output_ids": np.array([[10 + i]]),
                "final": False,
            }
        yield {
            "text_output": np.array([b"" if streamed else "".join(PIECES).encode()], np.object_),
            "output_ids": np.array([[-1]] if streamed else [[10, 11, 12, -1]]),
            "finish_reason": np.array([b"length"], np.object_),
            "prompt_tokens": np.array([[5]]),
            "final": True,
        }

    async def close(self) -> None:
        self.closed = True


def client(**kwargs: Any) -> tuple[TestClient, FakeTriton]:
    app = create_app("fake:8001", max_body=1 << 16, **kwargs)
    fake = FakeTriton()
    served: TritonClient = fake  # what the routes call, and all they call
    app.state.triton = served
    return TestClient(app), fake


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_models_list_each_served_model_with_its_kind_and_version():
    api, _ = client()
    got = api.get("/v1/models")
    assert got.status_code == 200
    assert got.json()["object"] == "list"
    assert [(m["id"], m["kind"], m["version"]) for m in got.json()["data"]] == [
        (m.name, m.kind, m.version) for m in MODELS
    ]
    assert api.get("/v1/models/gen").json()["owned_by"] == "hf2triton"
    error = error_of(api.get("/v1/models/nope"), 404)
    assert error["param"] == "model" and error["code"] == "model_not_found"


def test_embeddings_in_batches_of_the_models_size_with_usage():
    api, fake = client()
    texts = ["a b", "c", "d e f"]
    got = api.post("/v1/embeddings", json={"model": "emb", "input": texts})
    assert got.status_code == 200, got.text
    body = got.json()
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert [d["embedding"][0] for d in body["data"]] == [len(t) for t in texts]
    assert body["usage"] == {"prompt_tokens": 4 + 3 + 5, "total_tokens": 4 + 3 + 5}
    assert body["model"] == "emb" and fake.batches == [2, 1]  # max_batch_size 2
    got = api.post(
        "/v1/embeddings", json={"model": "emb", "input": "x", "encoding_format": "base64"}
    )
    vector = np.frombuffer(base64.b64decode(got.json()["data"][0]["embedding"]), "<f4")
    assert vector.tolist() == [1.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "body, param, says",
    [
        ({"model": "emb", "input": 3}, "input", "string"),
        ({"model": "emb", "input": []}, "input", "empty"),
        ({"model": "emb", "input": "x", "dimensions": 7}, "dimensions", "dimensions 7"),
        ({"input": "x"}, "model", "Field required"),
        ({"model": "gen", "input": "x"}, "model", "text_generation"),
    ],
)
def test_a_bad_request_is_a_400_error_object_naming_the_field(body, param, says):
    api, fake = client()
    error = error_of(api.post("/v1/embeddings", json=body), 400)
    assert error["param"] == param and says in error["message"], error
    assert error["type"] == "invalid_request_error"
    assert fake.batches == []  # refused before any inference


def test_malformed_and_oversized_bodies_and_unknown_routes():
    api, _ = client()
    error = error_of(
        api.post("/v1/embeddings", content=b'{"model": "emb", "input": ', headers=JSON), 400
    )
    assert "JSON" in error["message"] and error["param"] is None
    big = {"model": "emb", "input": "x" * (1 << 17)}
    assert error_of(api.post("/v1/embeddings", json=big), 413)["code"] == "request_too_large"
    assert error_of(api.post("/v1/nope", json={}), 404)["code"] == "not_found"
    assert error_of(api.get("/v1/embeddings"), 405)["message"] == "Method Not Allowed"


def test_keys_when_set_a_wrong_or_missing_one_is_a_401():
    api, _ = client(key_hashes=(hashlib.sha256(KEY.encode()).hexdigest(),))
    body = {"model": "emb", "input": "x"}
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": KEY}):
        error = error_of(api.post("/v1/embeddings", json=body, headers=headers), 401)
        assert error["code"] == "invalid_api_key"
    ok = api.post("/v1/embeddings", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200
    assert api.get("/health").json() == {"status": "ok", "triton": "fake:8001"}  # no key asked
    assert api.get("/metrics").status_code == 200


def events(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.text.endswith("data: [DONE]\n\n")
    frames = response.text.split("\n\n")
    assert frames[-1] == "" and all(f.startswith("data: ") for f in frames[:-1])
    return [f.removeprefix("data: ") for f in frames[:-1]]


def test_a_streamed_chat_completion_role_pieces_usage_then_done():
    api, _ = client()
    request = {
        "model": "gen",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with api.stream("POST", "/v1/chat/completions", json=request) as response:
        response.read()
        frames = events(response)
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert text == "".join(PIECES)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def test_a_completion_whole_and_its_token_ids():
    api, _ = client()
    got = api.post(
        "/v1/completions", json={"model": "gen", "prompt": "hi", "return_token_ids": True}
    )
    assert got.status_code == 200, got.text
    choice = got.json()["choices"][0]
    assert choice["text"] == "".join(PIECES) and choice["finish_reason"] == "length"
    assert choice["token_ids"] == [10, 11, 12]
    assert got.json()["object"] == "text_completion"
    error = error_of(
        api.post("/v1/completions", json={"model": "gen", "prompt": "hi", "n": 2}), 400
    )
    assert error["param"] == "n"


def test_rerank_in_cohere_and_tei_shapes_and_predict():
    api, _ = client()
    got = api.post(
        "/v1/rerank",
        json={"model": "rr", "query": "q", "documents": ["a", "bbb", "cc"], "top_n": 2},
    )
    assert [(r["index"], r["relevance_score"]) for r in got.json()["results"]] == [(1, 3), (2, 2)]
    got = api.post("/rerank", json={"query": "q", "texts": ["a", "bbb"], "return_text": True})
    assert got.json() == [
        {"index": 1, "score": 3.0, "text": "bbb"},
        {"index": 0, "score": 1.0, "text": "a"},
    ]
    assert error_of(api.post("/rerank", content=b"nope", headers=JSON), 400)["message"] == (
        "The body is not valid JSON"
    )
    got = api.post("/predict", json={"inputs": "x"})
    assert [a["label"] for a in got.json()] == ["pos", "neg"]


def test_metrics_count_requests_by_route_model_and_status():
    api, _ = client()
    api.post("/v1/embeddings", json={"model": "emb", "input": "x"})
    api.post("/v1/embeddings", json={"model": "emb", "input": 3})
    text = api.get("/metrics").text
    assert (
        'hf2triton_openai_requests_total{model="emb",route="/v1/embeddings",status="200"} 1.0'
        in text
    )
    assert 'hf2triton_openai_errors_total{model="",route="/v1/embeddings",status="400"} 1.0' in text


def test_the_app_closes_its_triton_client_at_shutdown():
    app = create_app("fake:8001")
    fake = FakeTriton()
    app.state.triton = fake
    with TestClient(app) as api:
        assert api.get("/health").status_code == 200
    assert fake.closed and app.state.triton is None
