"""Bodies in and out of the routes that read their own JSON (TEI's shapes), and the answers'
JSON, numpy arrays included."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from .errors import bad_request

M = TypeVar("M", bound=BaseModel)


class Json(Response):
    """JSON with numpy arrays written directly (orjson), NaN refused upstream."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        import orjson

        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


async def read_json(request: Request) -> dict[str, Any]:
    try:
        raw = json.loads(await request.body())
    except ValueError:
        raise bad_request("The body is not valid JSON") from None
    if not isinstance(raw, dict):
        raise bad_request("The body must be a JSON object")
    return raw


def parse(schema: type[M], raw: dict[str, Any]) -> M:
    """`raw` as `schema`, or a 400 naming the first field it fails on."""
    from pydantic import ValidationError

    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first.get("loc", ())]
        raise bad_request(
            f"{'.'.join(loc) or 'request'}: {str(first.get('msg')).removeprefix('Value error, ')}",
            param=loc[0] if loc else None,
        ) from None


def text_array(text: str) -> np.ndarray:
    return np.array([[text.encode("utf-8")]], dtype=np.object_)


def image_bytes(item: str, where: str, param: str = "inputs") -> bytes:
    """An image sent as a base64 data URI ("data:image/png;base64,...") or bare base64, as the
    file's bytes; 400 naming `where` (in the body's `param`) for a URL whose host the operator
    did not allow (the server reaches out to nothing else a client names) or what is not
    base64."""
    import base64
    import binascii

    text = item.strip()
    if text.startswith(("http://", "https://")):
        raise bad_request(
            f"{where} is a URL: this server does not fetch remote images from its host (an "
            "operator can allow hosts: deploy.openai.remote_image_hosts); send the image "
            "file as a base64 data URI (data:image/jpeg;base64,...)",
            param=param,
        )
    if text.startswith("data:"):
        header, sep, text = text.partition(",")
        if not sep or not header.endswith(";base64"):
            raise bad_request(
                f"{where} is a data URI that is not base64: send data:image/...;base64,...",
                param=param,
            )
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(
            f"{where} is not base64: send the image file as a base64 data URI", param=param
        ) from None


@dataclass(frozen=True)
class RemoteImages:
    """Which image URLs the API fetches (the operator's hosts), and the most it reads of one."""

    hosts: tuple[str, ...] = ()
    max_bytes: int = 4 << 20
    timeout_s: float = 10.0

    def allows(self, item: str) -> bool:
        from urllib.parse import urlsplit

        text = item.strip()
        if not text.startswith(("http://", "https://")):
            return False
        return (urlsplit(text).hostname or "").lower() in self.hosts

    async def fetch(self, url: str, where: str, param: str) -> bytes:
        """The file at `url`; 400 naming `where` when it cannot be had (an answer other than
        200, a redirect, too large, too slow, unreachable)."""
        import httpx

        try:
            async with httpx.AsyncClient(follow_redirects=False, timeout=self.timeout_s) as client:
                async with client.stream("GET", url.strip()) as answer:
                    if answer.status_code != 200:
                        raise bad_request(
                            f"{where}: fetching the image answered HTTP {answer.status_code} "
                            "(redirects are not followed)",
                            param=param,
                        )
                    data = bytearray()
                    async for chunk in answer.aiter_bytes():
                        data += chunk
                        if len(data) > self.max_bytes:
                            raise bad_request(
                                f"{where}: the image at the URL is over {self.max_bytes} bytes",
                                param=param,
                            )
                    return bytes(data)
        except httpx.HTTPError as exc:
            raise bad_request(
                f"{where}: the image could not be fetched ({type(exc).__name__})", param=param
            ) from None


async def images_array(
    items: list[str], param: str = "inputs", remote: RemoteImages | None = None
) -> np.ndarray:
    """One encoded image per row: a batch for a model's IMAGE input (`param`: the body's key
    that held them, for the errors); URLs of the `remote` hosts fetched, others refused."""
    remote = remote or RemoteImages()
    rows = []
    for i, item in enumerate(items):
        where = param if len(items) == 1 else f"{param}[{i}]"
        if remote.allows(item):
            rows.append([await remote.fetch(item, where, param)])
        else:
            rows.append([image_bytes(item, where, param)])
    return np.array(rows, dtype=np.object_)


async def input_array(
    name: str, items: list[str], param: str, remote: RemoteImages | None = None
) -> np.ndarray:
    """A batch of `items` for a model's input `name`: image files for IMAGE, else texts."""
    return await images_array(items, param, remote) if name == "IMAGE" else texts_array(items)


def texts_array(texts: list[str]) -> np.ndarray:
    """One text per row: a batch for a model's TEXT input."""
    return np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
