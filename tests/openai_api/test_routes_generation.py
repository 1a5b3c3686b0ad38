"""hf2triton/openai_api/routes_generation.py: chat completions and completions over the served
generator's stream. What the request sets reaches the model as its inputs (and nothing else),
tool calls come back in OpenAI's shape, and a refusal before any text is a 400 naming the field.
A stand-in for Triton (tests/openai_api/test_routes.py's) answers with a text of the test's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from hf2triton.openai_api.app import create_app
from hf2triton.openai_api.errors import bad_request
from hf2triton.openai_api.triton import Model
from tests.openai_api.test_routes import MODELS, FakeTriton, error_of, events

TOOLS_MODEL = Model(
    "qwen",
    "2",
    "text_generation",
    0,
    ("text_output", "output_ids", "finish_reason"),
    100,
    chat_tools="hermes",
)
USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


class Scripted(FakeTriton):
    """Answers every generation with `text` (or refuses: `refuse`), keeping what it was sent."""

    def __init__(self, text: str = "fine", reason: str = "stop", refuse: str = "") -> None:
        super().__init__()
        self.text, self.reason, self.refuse = text, reason, refuse
        self.sent: list[dict[str, np.ndarray]] = []

    async def models(self) -> list[Model]:
        return [*MODELS, TOOLS_MODEL]

    async def model(self, name: str, kinds: tuple[str, ...], route: str) -> Model:
        return TOOLS_MODEL if name == "qwen" else await super().model(name, kinds, route)

    async def stream(
        self, model: Model, arrays: dict[str, np.ndarray], prompt_param: str = "prompt"
    ) -> AsyncIterator[dict[str, Any]]:
        self.sent.append(arrays)
        if self.refuse:
            raise bad_request(self.refuse, param="max_tokens")
        yield {
            "text_output": np.array([self.text.encode()], np.object_),
            "output_ids": np.array([[7, 8, -1]]),
            "finish_reason": np.array([self.reason.encode()], np.object_),
            "prompt_tokens": np.array([[4]]),
            "prompt_logprob": np.array([[-3.5]], np.float32),
            "final": True,
        }


def api(fake: Scripted) -> TestClient:
    app = create_app("fake:8001")
    app.state.triton = fake
    return TestClient(app)


def test_what_the_request_sets_reaches_the_model_as_its_inputs():
    fake = Scripted()
    got = api(fake).post(
        "/v1/chat/completions",
        json={
            "model": "gen",
            "messages": USER,
            "max_tokens": 5,
            "temperature": 0.5,
            "top_k": 3,
            "seed": 2**63,
            "stop": "END",
        },
    )
    assert got.status_code == 200, got.text
    (sent,) = fake.sent
    assert json.loads(sent["messages"][0, 0]) == [{"role": "user", "content": "hi"}]
    assert sent["max_tokens"].tolist() == [[5]] and sent["max_tokens"].dtype == np.int32
    assert sent["temperature"].tolist() == [[0.5]] and sent["top_k"].tolist() == [[3]]
    assert sent["seed"].dtype == np.uint64 and int(sent["seed"][0, 0]) == 2**63
    assert sent["stop_words"].tolist() == [[b"END"]] and sent["stream"].tolist() == [[False]]
    assert not {"top_p", "repetition_penalty", "tools", "json_schema"} & set(
        sent
    )  # the model's defaults


def test_a_whole_answer_with_usage_token_ids_and_prompt_logprob():
    got = api(Scripted("all good", "length")).post(
        "/v1/completions",
        json={"model": "gen", "prompt": "hi", "return_token_ids": True, "prompt_logprob": True},
    )
    body = got.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert (choice["text"], choice["finish_reason"], choice["token_ids"]) == (
        "all good",
        "length",
        [7, 8],
    )
    assert choice["prompt_logprob"] == -3.5
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    error = error_of(
        api(Scripted()).post(
            "/v1/completions",
            json={"model": "gen", "prompt": "x", "stream": True, "prompt_logprob": True},
        ),
        400,
    )
    assert error["param"] == "prompt_logprob"


def test_a_forced_tool_call_is_constrained_and_comes_back_as_a_call():
    fake = Scripted('{"name": "weather", "arguments": {"city": "Oslo"}}')
    got = api(fake).post(
        "/v1/chat/completions",
        json={"model": "qwen", "messages": USER, "tools": [WEATHER], "tool_choice": "required"},
    )
    (choice,) = got.json()["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    (sent,) = fake.sent
    assert sent["assistant_prefix"].tolist() == [[b"<tool_call>\n"]]
    assert json.loads(sent["json_schema"][0, 0])["properties"]["name"] == {"const": "weather"}
    assert [t["function"]["name"] for t in json.loads(sent["tools"][0, 0])] == ["weather"]


def test_a_call_streamed_comes_as_its_own_chunk_then_the_reason():
    text = 'ok <tool_call>{"name": "weather", "arguments": {}}</tool_call>'
    request = {"model": "qwen", "messages": USER, "tools": [WEATHER], "stream": True}
    with api(Scripted(text)).stream("POST", "/v1/chat/completions", json=request) as response:
        response.read()
        frames = events(response)
    deltas = [json.loads(f)["choices"][0] for f in frames[:-1]]
    assert deltas[0]["delta"]["role"] == "assistant"
    calls = [d["delta"]["tool_calls"] for d in deltas if "tool_calls" in d["delta"]]
    assert [c[0]["function"]["name"] for c in calls] == ["weather"]
    assert deltas[-1]["finish_reason"] == "tool_calls"


def test_tools_for_a_model_whose_template_takes_none_are_refused():
    error = error_of(
        api(Scripted()).post(
            "/v1/chat/completions", json={"model": "gen", "messages": USER, "tools": [WEATHER]}
        ),
        400,
    )
    assert error["param"] == "tools" and "does not render tools" in error["message"]


def test_a_refusal_before_any_text_is_a_400_naming_the_field():
    fake = Scripted(refuse="max_tokens 900 is outside 1..127")
    error = error_of(
        api(fake).post(
            "/v1/completions",
            json={"model": "gen", "prompt": "x", "max_tokens": 900, "stream": True},
        ),
        400,
    )
    assert error["param"] == "max_tokens" and error["message"] == "max_tokens 900 is outside 1..127"
    error = error_of(api(fake).post("/v1/completions", json={"model": "emb", "prompt": "x"}), 400)
    assert error["param"] == "model" and "embedding" in error["message"]
