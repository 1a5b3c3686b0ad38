"""hf2triton/openai_api/tools.py: how a chat request's tools are served. A required or named call
is forced (its JSON constrained to the functions' parameter schemas, the answer starting as the
template's calls start), an `auto` call is read from the model's text, and a chat's earlier
calls go to the template with their arguments as objects."""

from __future__ import annotations

import json

import pytest

from hf2triton.openai_api.errors import ApiError
from hf2triton.openai_api.schemas import ChatRequest
from hf2triton.openai_api.tools import ToolMode, plan, read_calls, template_messages

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "time"}},
]
USER = [{"role": "user", "content": "weather in Oslo?"}]


def chat(**fields) -> ChatRequest:
    return ChatRequest.model_validate({"model": "m", "messages": USER, **fields})


def test_without_tools_or_with_choice_none_the_answer_is_free():
    assert plan(chat(), "hermes", "m") == (ToolMode(), None, "")
    assert plan(chat(tools=TOOLS, tool_choice="none"), "hermes", "m") == (ToolMode(), None, "")
    fmt = {"type": "json_object"}
    assert plan(chat(response_format=fmt), "", "m") == (ToolMode(), {"type": "object"}, "")


def test_a_named_call_is_forced_to_that_functions_parameters():
    choice = {"type": "function", "function": {"name": "weather"}}
    mode, schema, prefix = plan(chat(tools=TOOLS, tool_choice=choice), "hermes", "m")
    assert mode == ToolMode("hermes", forced=True, parallel=False) and prefix == "<tool_call>\n"
    assert schema == {
        "type": "object",
        "properties": {"name": {"const": "weather"}, "arguments": WEATHER},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    mode, schema, prefix = plan(chat(tools=TOOLS, tool_choice="required"), "json", "m")
    assert [b["properties"]["name"]["const"] for b in schema["anyOf"]] == ["weather", "time"]
    assert prefix == "" and mode.forced


def test_tools_the_template_cannot_render_or_with_a_response_format_are_refused():
    with pytest.raises(ApiError) as caught:
        plan(chat(tools=TOOLS), "", "tiny")
    assert (
        caught.value.param == "tools"
        and "model tiny's chat template does not render tools" in caught.value.message
    )
    with pytest.raises(ApiError) as caught:
        plan(chat(tools=TOOLS, response_format={"type": "json_object"}), "hermes", "m")
    assert caught.value.param == "response_format"


def test_calls_are_read_from_the_models_text_in_openais_shape():
    text = (
        'Let me look.<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    rest, calls = read_calls(text, ToolMode("hermes"))
    assert rest == "Let me look."
    (call,) = calls
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    two = text + '<tool_call>{"name": "time", "arguments": {}}</tool_call>'
    assert [c["function"]["name"] for c in read_calls(two, ToolMode("hermes"))[1]] == [
        "weather",
        "time",
    ]
    assert len(read_calls(two, ToolMode("hermes", parallel=False))[1]) == 1
    rest, calls = read_calls('{"name": "time", "parameters": {}}', ToolMode("json"))
    assert rest is None and calls[0]["function"]["arguments"] == "{}"
    forced = read_calls(
        '{"name": "weather", "arguments": {"city": "Å"}}', ToolMode("json", forced=True)
    )
    assert json.loads(forced[1][0]["function"]["arguments"]) == {"city": "Å"}


@pytest.mark.parametrize(
    "text", ["It is sunny.", '<tool_call>{"name": 3}</tool_call>', "{not json", '{"name": "x"}']
)
def test_text_that_is_no_call_stays_text(text):
    assert read_calls(text, ToolMode("hermes")) == (text, [])


def test_earlier_calls_reach_the_template_with_their_arguments_as_objects():
    body = chat(
        messages=[
            *USER,
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]
    )
    user, assistant, tool = template_messages(body.messages)
    assert user == {"role": "user", "content": "weather in Oslo?"}
    assert assistant == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "weather", "arguments": {"city": "Oslo"}},
            }
        ],
    }
    assert tool == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    broken = chat(
        messages=[
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}
        ]
    )
    with pytest.raises(ApiError) as caught:
        template_messages(broken.messages)
    assert (
        caught.value.param == "messages"
        and "messages.0.tool_calls.0.function.arguments is not JSON" in caught.value.message
    )
