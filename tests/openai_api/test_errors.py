"""hf2triton/openai_api/errors.py: OpenAI's error object with the status each failure gets, and the
request field a served model's refusal is about (the 400's `param`)."""

from __future__ import annotations

import pytest

from hf2triton.openai_api.errors import ApiError, bad_request, not_found, param_of, unavailable


def test_each_failure_is_openais_error_object_with_its_status():
    assert bad_request("top_p: too big", param="top_p").body() == {
        "error": {
            "message": "top_p: too big",
            "type": "invalid_request_error",
            "param": "top_p",
            "code": None,
        }
    }
    missing = not_found("nope")
    assert missing.status == 404 and missing.code == "model_not_found" and missing.param == "model"
    assert "The model 'nope' does not exist (GET /v1/models lists them)" == str(missing)
    down = unavailable("Triton is starting")
    assert (down.status, down.type, down.code) == (503, "service_unavailable", "model_not_ready")
    assert (
        isinstance(down, Exception)
        and ApiError(418, "x").body()["error"]["type"] == "invalid_request_error"
    )


@pytest.mark.parametrize(
    "message, param",
    [
        ("max_tokens 0 is outside 1..127", "max_tokens"),
        ("top_p 1.5 is outside (0, 1]", "top_p"),
        ("stop_words must be strings", "stop"),
        ("json_schema $.properties.s.pattern: is not supported", "response_format"),
        ("this model's chat template does not render tools: send no tools", "tools"),
        ("the prompt has 300 tokens, over this model's context length 128", "prompt"),
        ("TEXT[0] is not valid UTF-8", "input"),
        ("PASSAGES needs at least one passage", "documents"),
        ("generation failed: RuntimeError: boom", None),
    ],
)
def test_a_served_models_refusal_names_the_request_field(message, param):
    assert param_of(message) == param


def test_the_prompt_is_named_as_the_route_calls_it():
    assert param_of("the prompt is empty", prompt_param="messages") == "messages"
    assert param_of("text_input is empty", prompt_param="input") == "input"
