"""The API over one Triton server: the app with its shared state (state.py), a router per family
of routes, OpenAI's error object for every failure, and the middleware's limits (limits.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import (
    routes_audio,
    routes_embeddings,
    routes_generation,
    routes_health,
    routes_models,
    routes_predict,
    routes_ranking,
)
from .errors import ApiError, bad_request
from .limits import Limits
from .metrics import Metrics
from .state import Settings

# In this order in the OpenAPI document (/v1/openapi.json).
ROUTERS = (
    routes_health.router,
    routes_models.router,
    routes_embeddings.router,
    routes_generation.router,
    routes_ranking.router,
    routes_predict.router,
    routes_audio.router,
)


def create_app(
    triton_url: str,
    key_hashes: tuple[str, ...] = (),
    max_body: int = 4 << 20,
    timeout_s: float = 600.0,
    remote_image_hosts: tuple[str, ...] = (),
) -> Any:
    """The API over the Triton gRPC endpoint `triton_url` (host:port)."""
    app = FastAPI(
        title="hf2triton OpenAI-compatible API",
        docs_url=None,
        redoc_url=None,
        openapi_url="/v1/openapi.json",
        lifespan=lifespan,
    )
    app.state.settings = Settings(triton_url, max_body, timeout_s, remote_image_hosts)
    app.state.keys = tuple(key_hashes)
    app.state.metrics = Metrics()
    app.state.triton = None  # a state.TritonClient, made on first use (state.triton_of)
    add_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(Limits, state=app.state)
    return app


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    triton, app.state.triton = app.state.triton, None
    if triton is not None:
        await triton.close()


def add_error_handlers(app: FastAPI) -> None:
    """Every failure as OpenAI's error object: the API's own, a body that fails its schema (a
    400 naming the field), and Starlette's (404 for an unknown route, 405, ...)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body",)]
        param = loc[0] if loc else None
        message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        if first.get("type") == "json_invalid":
            message, param = "The body is not valid JSON", None
        shown = ".".join(loc) or "request"
        return JSONResponse(bad_request(f"{shown}: {message}", param).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return JSONResponse(
            ApiError(exc.status_code, str(exc.detail), code=code).body(),
            status_code=exc.status_code,
        )
