"""/v1/models: the models Triton serves now, each at its newest ready version, with its kind."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from .bodies import Json
from .errors import not_found
from .state import triton_of
from .triton import Model

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> Json:
    return Json(
        {"object": "list", "data": [describe(m) for m in await triton_of(request).models()]}
    )


@router.get("/v1/models/{name}")
async def one_model(name: str, request: Request) -> Json:
    for m in await triton_of(request).models():
        if m.name == name:
            return Json(describe(m))
    raise not_found(name)


def describe(m: Model) -> dict[str, Any]:
    return {
        "id": m.name,
        "object": "model",
        "created": m.created,
        "owned_by": "hf2triton",
        "version": m.version,
        "kind": m.kind,
    }
