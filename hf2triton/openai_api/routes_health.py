"""/health (Triton answers) and /metrics (the API's own, for Prometheus): asked without a key."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .errors import ApiError
from .state import settings_of, triton_of

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    triton_url = settings_of(request).triton_url
    if not await triton_of(request).live():
        raise ApiError(503, f"Triton at {triton_url} does not answer", type="service_unavailable")
    return {"status": "ok", "triton": triton_url}


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    text = request.app.state.metrics.text()
    return Response(text, media_type="text/plain; version=0.0.4")
