"""The ASGI middleware in front of every route: bearer keys (kept as sha256 hashes, compared in
constant time, never logged), the limit on a body's size, and each request's metrics."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

from .errors import ApiError

PUBLIC = ("/health", "/metrics")  # no key asked
DRAIN_LIMIT = 64 << 20  # a body over the limit but under this is read (and dropped) first


class Limits:
    """ASGI middleware: a body over the settings' `max_body` bytes is refused (413) before it is
    read whole, a request without a valid key (when keys are set) is refused (401), and every
    request is counted and timed by route and model. `state` is the app's (state.py): its keys,
    settings and metrics are read per request."""

    def __init__(self, app: Any, state: Any):
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        headers = dict(scope.get("headers") or [])
        max_body, metrics = self.state.settings.max_body, self.state.metrics
        if self.state.keys and not path.startswith(PUBLIC) and not self._allowed(headers):
            return await self._refuse(
                send,
                ApiError(
                    401,
                    "Incorrect or missing API key: send it as 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                ),
            )
        size = int(headers.get(b"content-length", b"0") or 0)
        if size > max_body:
            if size <= DRAIN_LIMIT:  # read and dropped: a client still sending sees the 413
                while (await receive()).get("more_body"):
                    pass
            return await self._refuse(
                send,
                ApiError(
                    413,
                    f"The request is {size} bytes, over this API's limit of {max_body}: "
                    "send fewer or shorter inputs per request",
                    code="request_too_large",
                ),
            )
        seen = [0]

        async def bounded() -> dict:
            message = await receive()
            seen[0] += len(message.get("body", b""))
            if seen[0] > max_body:
                raise ApiError(
                    413,
                    f"The request is over this API's limit of {max_body} bytes",
                    code="request_too_large",
                )
            return message

        status = [500]

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        started = time.perf_counter()
        scope.setdefault("state", {})
        try:
            await self.app(scope, bounded, sending)
        finally:
            if not path.startswith(PUBLIC):
                model = scope["state"].get("model", "")
                metrics.observe(path, model, status[0], time.perf_counter() - started)

    def _allowed(self, headers: dict[bytes, bytes]) -> bool:
        given = headers.get(b"authorization", b"").decode("latin-1")
        if not given.lower().startswith("bearer "):
            return False
        digest = hashlib.sha256(given[7:].strip().encode()).hexdigest()
        ok = False
        for h in self.state.keys:  # every one compared, in constant time each
            ok |= hmac.compare_digest(digest, h)
        return ok

    @staticmethod
    async def _refuse(send: Any, error: ApiError) -> None:
        body = json.dumps(error.body()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": error.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
