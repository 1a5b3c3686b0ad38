"""/v1/chat/completions and /v1/completions: a text generator's answer over Triton's decoupled
stream, whole or as server-sent events (OpenAI's chunks, then `data: [DONE]`)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from .bodies import Json, text_array
from .errors import ApiError, bad_request
from .schemas import ChatRequest, CompletionRequest, Generation
from .state import timed, triton_of
from .tools import ToolMode, plan, read_calls, template_messages
from .triton import Model

NO_TOOLS = ToolMode()

router = APIRouter()


@dataclass(frozen=True)
class Reply:
    """How one request's answer is framed: its id and creation time, the model's name, a chat
    (or a completion), the tool mode, and what else the request asked to get back (the
    stream's usage chunk, the generated ids)."""

    ident: str
    created: int
    model: str
    chat: bool
    mode: ToolMode = NO_TOOLS
    include_usage: bool = False
    token_ids: bool = False

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def frame(self, choices: list, usage: dict | None = None) -> dict[str, Any]:
        """The answer's (or a chunk's) object around `choices`."""
        body: dict[str, Any] = {
            "id": self.ident,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return body


@router.post("/v1/chat/completions")
async def chat(body: ChatRequest, request: Request) -> Response:
    request.state.model = body.model
    model = await triton_of(request).model(body.model, ("text_generation",), "/v1/chat/completions")
    try:
        messages = template_messages(body.messages)
    except ValueError as exc:
        raise bad_request(str(exc), param="messages") from None
    arrays = {"messages": text_array(json.dumps(messages, ensure_ascii=False)), **sampling(body)}
    mode, schema, prefix = plan(body, model.chat_tools, model.name)
    if mode.style:
        tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
        arrays["tools"] = text_array(json.dumps(tools, ensure_ascii=False))
    if prefix:
        arrays["assistant_prefix"] = text_array(prefix)
    if schema is not None:
        arrays["json_schema"] = text_array(json.dumps(schema, ensure_ascii=False))
    try:
        return await generate(request, model, body, arrays, chat=True, mode=mode)
    except ApiError as exc:
        if mode.forced and exc.param == "response_format":  # the forced call's schema
            exc.param = "tool_choice"
        raise


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    request.state.model = body.model
    model = await triton_of(request).model(body.model, ("text_generation",), "/v1/completions")
    arrays = {"text_input": text_array(str(body.prompt)), **sampling(body)}
    schema = body.response_format.constraint() if body.response_format else None
    if schema is not None:
        arrays["json_schema"] = text_array(json.dumps(schema, ensure_ascii=False))
    return await generate(request, model, body, arrays, chat=False)


async def generate(
    request: Request,
    model: Model,
    body: Generation,
    arrays: dict[str, np.ndarray],
    chat: bool,
    mode: ToolMode = NO_TOOLS,
) -> Response:
    prompt_param = "messages" if chat else "prompt"
    reply = Reply(
        ident=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model.name,
        chat=chat,
        mode=mode,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        token_ids=bool(body.return_token_ids),
    )
    arrays["stream"] = np.array([[bool(body.stream)]], dtype=bool)
    if body.prompt_logprob:
        if body.stream:
            raise bad_request(
                "prompt_logprob is answered without stream only", param="prompt_logprob"
            )
        arrays["return_prompt_logprob"] = np.array([[True]], dtype=bool)
    responses = triton_of(request).stream(model, arrays, prompt_param)
    # The first answer before anything is sent: a refused request is a plain 400.
    first = await timed(request, responses.__anext__())
    if not body.stream:
        answer = first
        while not answer["final"]:
            answer = await timed(request, responses.__anext__())
        return Json(whole(reply, answer, bool(body.prompt_logprob)))
    return StreamingResponse(
        events(reply, first, responses),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )


def whole(reply: Reply, answer: dict[str, Any], prompt_logprob: bool) -> dict[str, Any]:
    """The answer of a request without stream, from the final response."""
    text = first_text(answer)
    ids = [int(i) for i in answer["output_ids"].reshape(-1) if i >= 0]
    reason, content, calls = answered(text, finish(answer), reply.mode)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": reason,
        "logprobs": None,
        **({"message": message} if reply.chat else {"text": text}),
    }
    if reply.token_ids:
        choice["token_ids"] = ids
    if prompt_logprob:
        choice["prompt_logprob"] = float(answer["prompt_logprob"].reshape(-1)[0])
    return reply.frame([choice], usage_of(answer, len(ids)))


async def events(reply: Reply, first: dict, responses: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """The stream's server-sent events: a chat's role first, each piece of text as it comes,
    the usage when asked, and `[DONE]`; a failure midway is sent as an error event. With tools
    the answer is read whole first (a call is known once its JSON ends), then sent as OpenAI
    streams it: its content, then each call (id, name, arguments), then the finish reason."""
    chunked = reply.object + ".chunk" if reply.chat else reply.object

    def chunk(choices: list, usage: dict | None = None) -> bytes:
        body = {**reply.frame(choices, usage), "object": chunked}
        if reply.include_usage:
            body["usage"] = usage
        return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"

    if reply.chat:  # the role first, as OpenAI's streams start
        role = {"role": "assistant", "content": ""}
        yield chunk([{"index": 0, "delta": role, "finish_reason": None, "logprobs": None}])
    generated = 0
    answer = first
    held: list[str] = []
    try:
        while True:
            text = first_text(answer)
            found = answer.get("output_ids")
            ids = [int(i) for i in found.reshape(-1) if i >= 0] if found is not None else []
            generated += len(ids)
            reason = finish(answer) if answer["final"] else None
            if reply.mode.style:
                held.append(text)
                if reason:
                    for event in tool_events("".join(held), reason, reply.mode):
                        yield chunk([event])
            elif text or reason:
                yield chunk([piece(reply, text, reason, ids)])
            if answer["final"]:
                break
            answer = await responses.__anext__()
        if reply.include_usage:
            yield chunk([], usage_of(answer, generated))
    except ApiError as exc:
        yield b"data: " + json.dumps(exc.body()).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def piece(reply: Reply, text: str, reason: str | None, ids: list[int]) -> dict:
    """One stream chunk's choice: a piece of the text (a chat's delta), and the finish reason
    on the last."""
    out = (
        {"index": 0, "delta": {"content": text} if text else {}}
        if reply.chat
        else {"index": 0, "text": text}
    )
    out.update({"finish_reason": reason, "logprobs": None})
    if reply.token_ids:
        out["token_ids"] = ids
    return out


def answered(text: str, reason: str, mode: ToolMode) -> tuple[str, str | None, list[dict]]:
    """The finish reason, content and tool calls of an answer (a call cut short by max_tokens
    is no call: its text comes back, with finish_reason length)."""
    if not mode.style or reason == "length":
        return reason, text, []
    content, calls = read_calls(text, mode)
    return ("tool_calls" if calls else reason), content, calls


def tool_events(text: str, reason: str, mode: ToolMode) -> list[dict]:
    """The stream's choices of a whole answer with tools: its content, each call, the reason."""
    reason, content, calls = answered(text, reason, mode)
    out = []
    if content:
        out.append(
            {"index": 0, "delta": {"content": content}, "finish_reason": None, "logprobs": None}
        )
    for i, call in enumerate(calls):
        out.append(
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": i, **call}]},
                "finish_reason": None,
                "logprobs": None,
            }
        )
    out.append({"index": 0, "delta": {}, "finish_reason": reason, "logprobs": None})
    return out


def sampling(body: Generation) -> dict[str, np.ndarray]:
    """The served model's optional inputs for what the request sets (the rest: its defaults)."""
    arrays: dict[str, np.ndarray] = {}
    if body.tokens is not None:
        arrays["max_tokens"] = np.array([[body.tokens]], np.int32)
    for name in ("temperature", "top_p", "repetition_penalty"):
        value = getattr(body, name)
        if value is not None:
            arrays[name] = np.array([[value]], np.float32)
    if body.top_k is not None:
        arrays["top_k"] = np.array([[body.top_k]], np.int32)
    if body.seed is not None:
        arrays["seed"] = np.array([[body.seed]], np.uint64)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if stops:
        arrays["stop_words"] = np.array([[s.encode("utf-8") for s in stops]], dtype=np.object_)
    return arrays


def first_text(answer: dict[str, Any]) -> str:
    text = answer.get("text_output")
    if text is None or not text.size:
        return ""
    raw = text.reshape(-1)[0]
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


def finish(answer: dict[str, Any]) -> str:
    reason = answer.get("finish_reason")
    if reason is None or not reason.size:
        return "stop"
    value = reason.reshape(-1)[0]
    value = value.decode() if isinstance(value, bytes) else str(value)
    return {"cancelled": "stop"}.get(value, value)


def usage_of(answer: dict[str, Any], generated: int) -> dict[str, int]:
    prompt = answer.get("prompt_tokens")
    prompt_tokens = int(prompt.reshape(-1)[0]) if prompt is not None and prompt.size else 0
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": prompt_tokens + generated,
    }
