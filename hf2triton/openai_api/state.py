"""What the routes share, kept on the app's state: its settings, and the Triton server behind the
`TritonClient` Protocol (triton.Triton; a test's fake stands in), read off `request.app.state`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
from fastapi import Request

from .bodies import RemoteImages
from .errors import ApiError, bad_request
from .triton import Model, Triton

T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    triton_url: str  # Triton's gRPC endpoint, host:port
    max_body: int  # bytes in a request's body
    timeout_s: float  # for an answer (each of a generation's pieces before it streams)
    # Hosts whose image URLs the API fetches for a client (deploy.openai.remote_image_hosts);
    # empty: a URL is refused and images come as base64.
    remote_image_hosts: tuple[str, ...] = ()


class TritonClient(Protocol):
    """The calls the routes make to the Triton server (triton.Triton makes them over gRPC)."""

    async def live(self) -> bool: ...

    async def models(self) -> list[Model]: ...

    async def model(self, name: str, kinds: tuple[str, ...], route: str) -> Model: ...

    async def infer(
        self, model: Model, arrays: dict[str, np.ndarray], prompt_param: str = "input"
    ) -> dict[str, np.ndarray]: ...

    def stream(
        self, model: Model, arrays: dict[str, np.ndarray], prompt_param: str = "prompt"
    ) -> AsyncIterator[dict[str, Any]]: ...

    async def close(self) -> None: ...


def settings_of(request: Request) -> Settings:
    return request.app.state.settings


def remote_images(request: Request) -> RemoteImages:
    """The image URLs this API fetches: the operator's hosts, at most a body's size each."""
    settings = settings_of(request)
    return RemoteImages(settings.remote_image_hosts, settings.max_body)


def triton_of(request: Request) -> TritonClient:
    state = request.app.state
    if state.triton is None:  # made in the serving loop, where its gRPC channel lives
        client: TritonClient = Triton(state.settings.triton_url)
        state.triton = client
    return state.triton


async def timed(request: Request, answer: Awaitable[T]) -> T:
    """`answer`, or a 504 once it takes over the API's time limit."""
    timeout_s = settings_of(request).timeout_s
    try:
        return await asyncio.wait_for(answer, timeout_s)
    except TimeoutError:
        raise ApiError(
            504, f"The request took over {timeout_s:.0f} s", type="timeout", code="timeout"
        ) from None


async def infer_in_parts(
    request: Request, model: Model, name: str, batch: np.ndarray
) -> list[dict[str, np.ndarray]]:
    """The answers to `batch` (the model's input `name`), sent side by side in requests of the
    model's max_batch_size, in order; a 504 past the API's time limit."""
    triton, size = triton_of(request), model.max_batch_size or len(batch)
    parts = (triton.infer(model, {name: batch[i : i + size]}) for i in range(0, len(batch), size))
    return await timed(request, asyncio.gather(*parts))


async def only_model(request: Request, *kinds: str) -> str:
    """The one model of `kinds` served (TEI's requests name none)."""
    found = [m.name for m in await triton_of(request).models() if m.kind in kinds]
    if len(found) != 1:
        what = " or ".join(kinds)
        raise bad_request(f"name the model: {len(found)} {what} models are served", param="model")
    return found[0]
