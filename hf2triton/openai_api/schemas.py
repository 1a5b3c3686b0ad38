"""The requests the API takes, in OpenAI's (and Cohere's, text-embeddings-inference's) shapes.
A value of the wrong type or out of range, a NaN or an infinity, a field of another API's that
this one cannot honour: a 400 naming the field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

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
    # What the inputs are, as infinity takes it: texts, or images (base64 data URIs) for an
    # image-text embedder.
    modality: Literal["text", "image"] = "text"
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


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text, any JSON object, or JSON that validates against a schema
    (the decoding is constrained to it, strict or not)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @field_validator("json_schema")
    @classmethod
    def _given(cls, v: Any, info: ValidationInfo) -> Any:
        if info.data.get("type") != "json_schema" and v is not None:
            raise ValueError("json_schema goes with type json_schema")
        return v

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs json_schema: {name, schema, strict}")
        return self

    def constraint(self) -> dict[str, Any] | None:
        """The JSON Schema the answer must validate against (None: free text)."""
        if self.type == "json_object":
            return {"type": "object"}
        if self.type == "json_schema":
            if self.json_schema is None:
                raise ValueError("type json_schema needs json_schema: {name, schema}")
            return self.json_schema.schema_
        return None


class Function(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _an_object(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v.get("type", "object") != "object":
            raise ValueError("a function's parameters are a JSON Schema of type object")
        return v


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: Function


class NamedTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: dict[str, str]

    @field_validator("function")
    @classmethod
    def _named(cls, v: dict[str, str]) -> dict[str, str]:
        if not isinstance(v.get("name"), str) or not v["name"]:
            raise ValueError('name the function: {"type": "function", "function": {"name": ...}}')
        return v


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
    response_format: ResponseFormat | None = None

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

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

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
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool = True

    @field_validator("tools")
    @classmethod
    def _distinct(cls, v: list[Tool] | None) -> list[Tool] | None:
        names = [t.function.name for t in v or []]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two tools are named {twice[0]!r}")
        return v or None

    @field_validator("tool_choice")
    @classmethod
    def _known(cls, v: Any, info: ValidationInfo) -> Any:
        tools = info.data.get("tools") or []
        if isinstance(v, NamedTool) and v.function["name"] not in [t.function.name for t in tools]:
            raise ValueError(f"names {v.function['name']!r}, which tools does not define")
        if v in ("required",) and not tools:
            raise ValueError("required needs tools")
        return v


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
    """text-embeddings-inference's /predict: `inputs` a text or a list of texts (images for an
    image model); for an image-text embedder, the zero-shot `labels` and their template."""

    model_config = ConfigDict(extra="allow")

    inputs: str | list[str]
    model: str | None = None
    labels: list[str] | None = Field(None, min_length=1, max_length=MAX_INPUTS)
    label_template: str = "a photo of {}."

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not all(x.strip() for x in v):
            raise ValueError("a label is empty: give each label as text")
        return v

    @field_validator("label_template")
    @classmethod
    def _template(cls, v: str) -> str:
        if "{}" not in v:
            raise ValueError(f"{v!r} has no {{}} where the label goes: e.g. 'a photo of {{}}.'")
        return v
