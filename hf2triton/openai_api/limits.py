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
        if await self._refused(path, headers, receive, send):
            return None
        io = _Bounded(receive, send, self.state.settings.max_body)
        started = time.perf_counter()
        scope.setdefault("state", {})
        try:
            await self.app(scope, io.receive, io.send)
        except ApiError:
            if not io.over:
                raise
            if io.status != 413:  # raised out of the app before any answer: the 413 goes here
                io.status = 413
                await _refuse(send, io.too_large)
        finally:
            if not path.startswith(PUBLIC):
                model = scope["state"].get("model", "")
                self.state.metrics.observe(path, model, io.status, time.perf_counter() - started)
        return None

    async def _refused(
        self, path: str, headers: dict[bytes, bytes], receive: Any, send: Any
    ) -> bool:
        """Whether the request was refused before the app saw it: no valid key (401), or a
        body whose told length is over the limit (413)."""
        max_body = self.state.settings.max_body
        if self.state.keys and not path.startswith(PUBLIC) and not self._allowed(headers):
            await _refuse(
                send,
                ApiError(
                    401,
                    "Incorrect or missing API key: send it as 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                ),
            )
            return True
        size = int(headers.get(b"content-length", b"0") or 0)
        if size <= max_body:
            return False
        if size <= DRAIN_LIMIT:  # read and dropped: a client still sending sees the 413
            while (await receive()).get("more_body"):
                pass
        await _refuse(
            send,
            ApiError(
                413,
                f"The request is {size} bytes, over this API's limit of {max_body}: "
                "send fewer or shorter inputs per request",
                code="request_too_large",
            ),
        )
        return True

    def _allowed(self, headers: dict[bytes, bytes]) -> bool:
        given = headers.get(b"authorization", b"").decode("latin-1")
        if not given.lower().startswith("bearer "):
            return False
        digest = hashlib.sha256(given[7:].strip().encode()).hexdigest()
        ok = False
        for h in self.state.keys:  # every one compared, in constant time each
            ok |= hmac.compare_digest(digest, h)
        return ok


class _Bounded:
    """A request's body counted as the app reads it: past `max_body` the read raises the 413,
    and whatever the app then answers (FastAPI's "error parsing the body" 400, for a route that
    lets it parse the body) is replaced by that 413. `status`: what the client was sent."""

    def __init__(self, receive: Any, send: Any, max_body: int):
        self._receive, self._send, self.max_body = receive, send, max_body
        self.seen, self.over, self.status = 0, False, 500
        self.too_large = ApiError(
            413,
            f"The request is over this API's limit of {max_body} bytes",
            code="request_too_large",
        )

    async def receive(self) -> dict:
        message = await self._receive()
        self.seen += len(message.get("body", b""))
        if self.seen > self.max_body:
            self.over = True
            raise self.too_large
        return message

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = 413 if self.over else message["status"]
            if self.over:
                await _refuse(self._send, self.too_large)
        if not self.over:
            await self._send(message)


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
