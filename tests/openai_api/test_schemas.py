"""hf2triton/openai_api/schemas.py: the requests the API takes. A value of the wrong type or out of
range, a NaN, or a field of OpenAI's API that is not served is refused naming the field (the
400's `param`, through bodies.parse); clients' own extra fields pass."""

from __future__ import annotations

import pytest

from hf2triton.openai_api.bodies import parse
from hf2triton.openai_api.errors import ApiError
from hf2triton.openai_api.schemas import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Message,
    RerankRequest,
    ResponseFormat,
)

USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def refused(schema, body) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(schema, body)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    "schema, body, param, says",
    [
        (EmbeddingRequest, {"model": "m", "input": [1, 2]}, "input", "token ids are not taken"),
        (EmbeddingRequest, {"model": "m", "input": ""}, "input", "input is empty"),
        (EmbeddingRequest, {"model": "m", "input": ["x"] * 2049}, "input", "at most 2048 texts"),
        (EmbeddingRequest, {"model": "", "input": "x"}, "model", "at least 1 character"),
        (
            EmbeddingRequest,
            {"model": "m", "input": "x", "encoding_format": "int8"},
            "encoding_format",
            "'float' or 'base64'",
        ),
        (ChatRequest, {"model": "m", "messages": []}, "messages", "at least 1 item"),
        (
            ChatRequest,
            {"model": "m", "messages": [{"role": "robot", "content": "x"}]},
            "messages",
            "role",
        ),
        (
            ChatRequest,
            {"model": "m", "messages": USER, "temperature": float("nan")},
            "temperature",
            "finite",
        ),
        (ChatRequest, {"model": "m", "messages": USER, "top_p": 0}, "top_p", "greater than 0"),
        (
            ChatRequest,
            {"model": "m", "messages": USER, "max_tokens": 0},
            "max_tokens",
            "greater than or equal to 1",
        ),
        (ChatRequest, {"model": "m", "messages": USER, "n": 2}, "n", "only one choice per request"),
        (
            ChatRequest,
            {"model": "m", "messages": USER, "presence_penalty": 0.5},
            "presence_penalty",
            "use repetition_penalty",
        ),
        (ChatRequest, {"model": "m", "messages": USER, "logprobs": True}, "logprobs", "not served"),
        (
            ChatRequest,
            {"model": "m", "messages": USER, "stop": ["x"] * 17},
            "stop",
            "at most 16 stop strings",
        ),
        (
            ChatRequest,
            {"model": "m", "messages": USER, "seed": -1},
            "seed",
            "greater than or equal to 0",
        ),
        (
            ChatRequest,
            {"model": "m", "messages": USER, "tools": [TOOL, TOOL]},
            "tools",
            "two tools are named 'get_time'",
        ),
        (
            ChatRequest,
            {"model": "m", "messages": USER, "tool_choice": "required"},
            "tool_choice",
            "required needs tools",
        ),
        (
            ChatRequest,
            {
                "model": "m",
                "messages": USER,
                "tools": [TOOL],
                "tool_choice": {"type": "function", "function": {"name": "other"}},
            },
            "tool_choice",
            "names 'other', which tools does not define",
        ),
        (
            ChatRequest,
            {
                "model": "m",
                "messages": USER,
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
                ],
            },
            "tools",
            "parameters are a JSON Schema of type object",
        ),
        (
            ChatRequest,
            {"model": "m", "messages": USER, "response_format": {"type": "json_schema"}},
            "response_format",
            "needs json_schema",
        ),
        (
            CompletionRequest,
            {"model": "m", "prompt": ["a", "b"]},
            "prompt",
            "one prompt per request",
        ),
        (
            RerankRequest,
            {"model": "m", "query": "q", "documents": []},
            "documents",
            "at least 1 item",
        ),
        (
            RerankRequest,
            {"model": "m", "query": "q", "documents": ["a"], "top_n": 0},
            "top_n",
            "greater than or equal to 1",
        ),
    ],
)
def test_a_bad_field_is_refused_naming_it(schema, body, param, says):
    error = refused(schema, body)
    assert error.param == param, error.message
    assert says in error.message and error.message.startswith(param)


def test_good_requests_read_as_sent_with_extras_let_through():
    chat = parse(
        ChatRequest,
        {
            "model": "m",
            "messages": USER,
            "max_completion_tokens": 5,
            "max_tokens": 9,
            "x_client": 1,
        },
    )
    assert chat.tokens == 5 and chat.model_extra == {"x_client": 1}
    assert parse(ChatRequest, {"model": "m", "messages": USER, "max_tokens": 9}).tokens == 9
    assert parse(CompletionRequest, {"model": "m", "prompt": ["only"]}).prompt == "only"
    rerank = parse(RerankRequest, {"model": "m", "query": "q", "documents": ["a", {"text": "b"}]})
    assert rerank.texts() == ["a", "b"]
    with pytest.raises(ValueError, match='each is a string or {"text": ...}'):
        parse(RerankRequest, {"model": "m", "query": "q", "documents": [{"title": "b"}]}).texts()


def test_response_formats_give_the_schema_the_answer_must_follow():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    named = {
        "type": "json_schema",
        "json_schema": {"name": "thing", "schema": schema, "strict": True},
    }
    assert ResponseFormat.model_validate(named).constraint() == schema
    assert ResponseFormat.model_validate({"type": "json_object"}).constraint() == {"type": "object"}
    assert ResponseFormat.model_validate({"type": "text"}).constraint() is None
    error = refused(
        ChatRequest,
        {
            "model": "m",
            "messages": USER,
            "response_format": {"type": "text", "json_schema": named["json_schema"]},
        },
    )
    assert "json_schema goes with type json_schema" in error.message


def test_message_text_joins_text_parts_and_refuses_others():
    parts = Message(
        role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    )
    assert parts.text() == "ab" and Message(role="assistant").text() == ""
    image = Message(role="user", content=[{"type": "image_url", "image_url": {"url": "x"}}])
    with pytest.raises(ValueError, match="a content part of type 'image_url' is not served"):
        image.text()


def test_zero_shot_labels_and_their_template_are_checked():
    from hf2triton.openai_api.schemas import PredictRequest

    ok = PredictRequest(inputs=["x"], labels=["cat"], label_template="an image of {}")
    assert ok.labels == ["cat"] and ok.label_template == "an image of {}"
    with pytest.raises(ValueError, match="a label is empty"):
        PredictRequest(inputs=["x"], labels=["cat", " "])
    with pytest.raises(ValueError, match="has no {} where the label goes"):
        PredictRequest(inputs=["x"], labels=["cat"], label_template="a photo")
