"""The requests the API takes, in OpenAI's (and Cohere's, text-embeddings-inference's) shapes.
A value of the wrong type or out of range, a NaN or an infinity, a field of another API's that
this one cannot honour: a 400 naming the field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

Finite = Annotated[float, Field(allow_inf_nan=False)]
MAX_INPUTS = 2048  # texts in one embeddings request, as OpenAI's API allows
# Generation fields of OpenAI's API that are not served: the one value taken, and why not.
NOT_SERVED: dict[str, tuple[Any, str]] = {
    "n": (1, "only one choice per request is served (n=1)"),
    "presence_penalty": (0.0, "not served: use repetition_penalty"),
    "frequency_penalty": (0.0, "not served: use repetition_penalty"),
    "logprobs": (None, "log-probabilities of the generated tokens are not served"),
}


class Request(BaseModel):
    # Unknown fields are let through (clients send their own extras), NaN never is.
    model_config = ConfigDict(extra="allow", ser_json_inf_nan="null")

    model: str = Field(min_length=1)


class EmbeddingRequest(Request):
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _texts(cls, v: Any) -> Any:
        if isinstance(v, list) and v and not all(isinstance(x, str) for x in v):
            raise ValueError(
                "send text: a string or a list of strings (token ids are not "
                "taken: this API tokenizes as the served model does)"
            )
        if v == [] or v == "":
            raise ValueError("input is empty: send at least one text")
        if isinstance(v, list) and len(v) > MAX_INPUTS:
            raise ValueError(
                f"at most {MAX_INPUTS} texts per request (OpenAI's limit), got "
                f"{len(v)}: send the others in requests of their own"
            )
        return v


class StreamOptions(BaseModel):
    include_usage: bool = False


class Generation(Request):
    """What chat completions and completions share."""

    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: Finite | None = Field(None, ge=0, le=100)
    top_p: Finite | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    repetition_penalty: Finite | None = Field(None, gt=0, le=100)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**64)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Finite = 0.0
    frequency_penalty: Finite = 0.0
    logprobs: bool | int | None = None
    # Extensions: the generated token ids in each choice (vLLM's name), and the prompt's
    # log-probability under the model (the sum over its tokens; what hf2triton's gate scores).
    return_token_ids: bool = False
    prompt_logprob: bool = False

    # What is not served is refused by the field it is asked in (the error's `param`).
    @field_validator(*NOT_SERVED)
    @classmethod
    def _not_served(cls, v: Any, info: ValidationInfo) -> Any:
        served, why = NOT_SERVED[str(info.field_name)]
        if v != served and v:
            raise ValueError(why)
        return v

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop strings")
        return v

    @property
    def tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text; parts other than text are not served."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"messages: a content part of type {part.get('type')!r} is "
                    "not served (text only)"
                )
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(Generation):
    messages: list[Message] = Field(min_length=1)


class CompletionRequest(Generation):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one(cls, v: Any) -> Any:
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("one prompt per request")
            return v[0]
        return v


class RerankRequest(Request):
    query: str
    documents: list[str | dict[str, Any]] = Field(min_length=1)
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False

    def texts(self) -> list[str]:
        out = []
        for d in self.documents:
            text = d if isinstance(d, str) else d.get("text")
            if not isinstance(text, str):
                raise ValueError('documents: each is a string or {"text": ...}')
            out.append(text)
        return out


class PredictRequest(BaseModel):
    """text-embeddings-inference's /predict: `inputs` a text or a list of texts."""

    model_config = ConfigDict(extra="allow")

    inputs: str | list[str]
    model: str | None = None
