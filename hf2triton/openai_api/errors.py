"""OpenAI's error object, and the status each kind of failure gets."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A request that fails with `status` and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code = param, code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model '{model}' does not exist (GET /v1/models lists them)",
        param="model",
        code="model_not_found",
    )


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, type="service_unavailable", code="model_not_ready")


# Request fields a served model's error message starts with: the `param` its 400 names.
PARAMS = (
    ("max_tokens", "max_tokens"),
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("repetition_penalty", "repetition_penalty"),
    ("stop_words", "stop"),
    ("seed", "seed"),
    ("messages", "messages"),
    ("json_schema", "response_format"),
    ("tools", "tools"),
    ("this model's chat template does not render tools", "tools"),
    ("the prompt", "prompt"),
    ("text_input", "prompt"),
    ("TEXT", "input"),
    ("IMAGE", "inputs"),
    ("QUERY", "query"),
    ("PASSAGES", "documents"),
)


def param_of(message: str, prompt_param: str = "prompt") -> str | None:
    """The request field a served model's refusal is about (by how its message begins)."""
    text = message.strip().lower()
    for start, param in PARAMS:
        if text.startswith(start.lower()) or f" {start.lower()} " in text[:40]:
            return prompt_param if param == "prompt" else param
    return None
