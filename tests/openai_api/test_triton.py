"""hf2triton/openai_api/triton.py: the models Triton serves as the API sees them (each model's kind
read off the tensors it declares, the newest ready version, a classifier's labels, an
embedder's width), and Triton's refusals as API errors by status code. A stand-in for
tritonclient's asyncio gRPC client answers with a repository index and model configs."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from hf2triton.openai_api.errors import ApiError
from hf2triton.openai_api.triton import Triton, kind_of, refusal


def tensors(*names: str, dims: list[int] | None = None) -> list[dict]:
    return [{"name": n, **({"dims": dims} if dims else {})} for n in names]


CONFIGS = {
    "emb": {
        "input": tensors("TEXT"),
        "output": tensors("EMBEDDING", "TOKENS", dims=[-1, 384]),
        "max_batch_size": 8,
    },
    "cls": {
        "input": tensors("TEXT"),
        "output": tensors("LABEL", "SCORES"),
        "parameters": {"labels": {"string_value": json.dumps(["neg", "pos"])}},
    },
    "gen": {
        "input": tensors("text_input", "messages"),
        "output": tensors("text_output", "output_ids"),
        "parameters": {"chat_tools": {"string_value": "hermes"}},
    },
    "other": {"input": tensors("IMAGE"), "output": tensors("BOXES")},
}
INDEX = [
    {"name": "emb", "version": "1", "state": "READY"},
    {"name": "emb", "version": "3", "state": "READY"},
    {"name": "emb", "version": "4", "state": "LOADING"},
    {"name": "cls", "version": "1", "state": "READY"},
    {"name": "gen", "version": "2", "state": "READY"},
    {"name": "other", "version": "1", "state": "READY"},
    {"name": "down", "version": "1", "state": "UNAVAILABLE"},
]


class Client:
    """tritonclient.grpc.aio's InferenceServerClient, as far as the index and configs go."""

    def __init__(self) -> None:
        self.index, self.asked, self.sent = INDEX, [], []

    async def get_model_repository_index(self, as_json=True):
        return {"models": self.index}

    async def get_model_config(self, name, version, as_json=True):
        self.asked.append((name, version))
        return {"config": CONFIGS[name]}

    async def infer(self, name, inputs, model_version=""):
        self.sent.append((name, model_version))
        return Result()


class Result:
    def as_numpy(self, name):
        return None


def served(check):
    """`check(server)` run against a Triton over the stand-in client (made in the loop, where
    gRPC's asyncio client lives; no connection is made)."""

    async def go():
        server = Triton("localhost:1")
        server.client = Client()
        return await check(server)

    return asyncio.run(go())


def test_models_lists_the_newest_ready_version_of_each_hf2triton_model():
    async def check(server):
        return {m.name: m for m in await server.models()}

    models = served(check)
    assert sorted(models) == ["cls", "emb", "gen"]  # "other" is no hf2triton kind, "down" not ready
    emb = models["emb"]
    assert (emb.version, emb.kind, emb.width, emb.max_batch_size) == ("3", "embedding", 384, 8)
    assert models["cls"].labels == ("neg", "pos") and models["cls"].kind == "classification"
    assert models["gen"].kind == "text_generation" and models["gen"].chat_tools == "hermes"


REFUSED = [
    ("nope", 404, "The model 'nope' does not exist"),
    ("down", 503, "The model 'down' is not ready (UNAVAILABLE): try again shortly"),
    ("emb:4", 503, "The model 'emb' version 4 is not ready (LOADING)"),
    (
        "gen",
        400,
        "The model 'gen' is a text_generation model: /v1/embeddings serves embedding models",
    ),
    ("other", 400, "is a non-hf2triton model"),
]


def test_a_model_asked_for_by_name_or_version_and_each_way_it_is_refused():
    async def check(server):
        found = [await server.model(n, ("embedding",), "/v1/embeddings") for n in ("emb", "emb:1")]
        errors = []
        for name, _, _ in REFUSED:
            try:
                await server.model(name, ("embedding",), "/v1/embeddings")
            except ApiError as exc:
                errors.append(exc)
        return found, errors

    found, errors = served(check)
    assert [m.version for m in found] == ["3", "1"]
    assert len(errors) == len(REFUSED)
    for error, (_, status, says) in zip(errors, REFUSED):
        assert error.status == status and says in error.message, error.message
        assert error.param == "model" or status == 503


def test_a_served_versions_config_is_read_once():
    async def check(server):
        await server.models()
        await server.models()
        return server.client.asked

    asked = served(check)
    for version in (("cls", "1"), ("emb", "3"), ("gen", "2")):  # each model's config, once
        assert asked.count(version) == 1, asked


def test_a_request_that_names_no_version_lets_triton_pick_the_newest_ready_one():
    """Sent unversioned, as Triton's own clients send: the version the index showed may be
    unloaded by the time the request comes (a rollback's switch, the newer one going away),
    and Triton answers with the one left. A version the request names is sent as named."""

    async def check(server):
        for name in ("emb", "emb:1"):
            model = await server.model(name, ("embedding",), "/v1/embeddings")
            await server.infer(model, {"TEXT": np.array([[b"hi"]], dtype=np.object_)})
        return server.client.sent

    assert served(check) == [("emb", ""), ("emb", "1")]


def test_a_version_the_kept_index_shows_loading_is_looked_up_again_before_a_refusal():
    """The index is kept for a moment; a version that finished loading since (a rollback's
    smoke request right after the load) is found, not refused as not ready."""
    import time

    async def check(server):
        server.index = (time.monotonic(), INDEX)  # kept while version 4 was LOADING
        server.client.index = [{**m, "state": "READY"} if m["version"] == "4" else m for m in INDEX]
        return await server.model("emb:4", ("embedding",), "/v1/embeddings")

    assert served(check).version == "4"


class Failure(Exception):
    def __init__(self, status: str, message: str) -> None:
        self._status, self._message = status, message

    def status(self) -> str:
        return self._status

    def message(self) -> str:
        return self._message


@pytest.mark.parametrize(
    "status, message, code, param",
    [
        ("StatusCode.INVALID_ARGUMENT", "top_p 2 is outside (0, 1]", 400, "top_p"),
        ("", "the prompt has 300 tokens, over this model's context length", 400, "messages"),
        ("StatusCode.UNAVAILABLE", "connection refused", 503, None),
        ("StatusCode.RESOURCE_EXHAUSTED", "queue full", 503, None),
        ("StatusCode.NOT_FOUND", "no model", 404, "model"),
        ("StatusCode.INTERNAL", "stub died", 502, None),
    ],
)
def test_tritons_refusals_become_api_errors_by_status(status, message, code, param):
    error = refusal(Failure(status, message), "messages")
    assert (error.status, error.param) == (code, param)
    assert message in error.message


def _config(inputs: set[str], outputs: set[str], **parameters: str) -> dict:
    return {
        "input": [{"name": n} for n in sorted(inputs)],
        "output": [{"name": n} for n in sorted(outputs)],
        "parameters": {k: {"string_value": v} for k, v in parameters.items()},
    }


def test_a_models_kind_is_the_one_its_config_declares():
    assert kind_of(_config({"IMAGE", "TEXT"}, {"EMBEDDING"}, kind="image_text_embedding")) == (
        "image_text_embedding"
    )
    # The declaration wins over what the tensors would tell.
    assert kind_of(_config({"TEXT"}, {"EMBEDDING"}, kind="embedding")) == "embedding"


def test_versions_released_before_the_declaration_are_told_by_their_tensors():
    assert kind_of(_config({"QUERY", "PASSAGES"}, {"SCORES"})) == "reranking"
    assert kind_of(_config({"TEXT", "NUM_BEAMS"}, {"TRANSLATION", "TRUNCATED"})) == "translation"
    assert kind_of(_config({"TEXT"}, {"SCORES"})) is None
