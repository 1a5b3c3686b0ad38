"""Tool calling on a text generator: the tools go to the model's chat template, which renders
them its own way; a call the request requires (`tool_choice` required, or a named function) is
forced (the answer starts as the template's calls start, and its JSON is constrained to the
functions' parameter schemas), one the model makes of its own accord (`auto`) is parsed from its
text. Templates: Qwen2/Hermes style (a call is `{"name": ..., "arguments": {...}}` in
<tool_call> tags) and any other that renders `tools` (a call is that JSON object alone)."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from .errors import bad_request
from .schemas import ChatRequest, Message, NamedTool

HERMES = re.compile(r"<tool_call>\s*(\{.*?\})\s*(?:</tool_call>|$)", re.DOTALL)
PREFIX = {"hermes": "<tool_call>\n", "json": ""}


@dataclass(frozen=True)
class ToolMode:
    """How one request's answer is read: `style` of the template's calls ("" no tools), whether
    the call was forced, and whether several calls may come back."""

    style: str = ""
    forced: bool = False
    parallel: bool = True


def template_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The chat as templates take it: text content, an assistant's tool_calls with their
    arguments as objects (templates write them out with tojson), a tool turn's id and name."""
    out = []
    for i, m in enumerate(messages):
        item: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            calls = []
            for j, call in enumerate(m.tool_calls):
                function = call.get("function") or {}
                args = function.get("arguments", "{}")
                try:
                    parsed = json.loads(args) if isinstance(args, str) else args
                except json.JSONDecodeError:
                    raise bad_request(
                        f"messages.{i}.tool_calls.{j}.function.arguments is not JSON",
                        param="messages",
                    ) from None
                calls.append(
                    {
                        "id": call.get("id"),
                        "type": "function",
                        "function": {"name": function.get("name"), "arguments": parsed},
                    }
                )
            item["tool_calls"] = calls
            if not m.content:
                item["content"] = None
        for key in ("tool_call_id", "name"):
            if getattr(m, key):
                item[key] = getattr(m, key)
        out.append(item)
    return out


def plan(body: ChatRequest, style: str, model: str) -> tuple[ToolMode, dict[str, Any] | None, str]:
    """The request's tool mode, the schema its answer is constrained to (None: free), and the
    text the answer starts with."""
    choice = body.tool_choice or ("auto" if body.tools else "none")
    schema = body.response_format.constraint() if body.response_format else None
    if not body.tools or choice == "none":
        return ToolMode(), schema, ""
    if not style:
        raise bad_request(
            f"model {model}'s chat template does not render tools, so it cannot call them: send "
            "no tools (or serve a model whose template takes them, such as Qwen2's)",
            param="tools",
        )
    if schema is not None:
        raise bad_request(
            "response_format with tools is served with tool_choice none only: a forced call is "
            "already constrained to its function's parameters",
            param="response_format",
        )
    if choice == "auto":
        return ToolMode(style, False, body.parallel_tool_calls), None, ""
    tools = body.tools
    if isinstance(choice, NamedTool):
        tools = [t for t in tools if t.function.name == choice.function["name"]]
    branches = [
        {
            "type": "object",
            "properties": {"name": {"const": t.function.name}, "arguments": t.function.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    forced = branches[0] if len(branches) == 1 else {"anyOf": branches}
    return ToolMode(style, True, False), forced, PREFIX[style]


def read_calls(text: str, mode: ToolMode) -> tuple[str | None, list[dict[str, Any]]]:
    """The answer's text and its tool calls (OpenAI's shape, arguments as JSON text)."""
    found: list[dict[str, Any]] = []
    rest = text
    if mode.forced:
        candidates = [text.strip()]
        rest = ""
    elif mode.style == "hermes":
        candidates = HERMES.findall(text)
        rest = HERMES.sub("", text).strip()
    else:
        candidates = [text.strip()] if text.strip().startswith("{") else []
    for raw in candidates:
        try:
            call = json.loads(raw)
        except json.JSONDecodeError:
            continue
        args = call.get("arguments", call.get("parameters")) if isinstance(call, dict) else None
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("name"), str)
            or not isinstance(args, dict)
        ):
            continue
        found.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(args, ensure_ascii=False),
                },
            }
        )
    if not found:
        return text, []
    if not mode.parallel:
        found = found[:1]
    if mode.style == "json" and not mode.forced:
        rest = ""
    return (rest or None), found
