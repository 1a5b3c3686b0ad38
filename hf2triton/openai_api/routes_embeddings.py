"""/v1/embeddings: an embedder's vectors for up to 2048 texts, sent to Triton in batches of its
max_batch_size, as floats or base64 (little-endian float32), with the tokens embedded as usage.
An image-text embedder (CLIP) takes texts, or images with `modality: image` (as infinity does):
each a base64 data URI (or bare base64) of the image file."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Request

from .bodies import Json, input_array
from .errors import bad_request
from .schemas import EmbeddingRequest
from .state import infer_in_parts, remote_images, triton_of

router = APIRouter()
EMBEDDERS = ("embedding", "image_text_embedding")  # the kinds this route serves


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request) -> Json:
    request.state.model = body.model
    triton = triton_of(request)
    model = await triton.model(body.model, EMBEDDERS, "/v1/embeddings")
    if body.modality == "image" and model.kind != "image_text_embedding":
        raise bad_request(
            f"modality image: model {model.name!r} embeds texts only; send texts, or name an "
            "image-text embedder",
            param="modality",
        )
    # A size the model does not make is refused before any inference is run.
    if body.dimensions is not None and model.width and body.dimensions != model.width:
        raise bad_request(
            f"dimensions {body.dimensions}: this model's embeddings have {model.width}",
            param="dimensions",
        )
    texts = [body.input] if isinstance(body.input, str) else body.input
    name = "IMAGE" if body.modality == "image" else "TEXT"
    # Every item read (an image decoded from base64 or fetched) before any inference.
    batch = await input_array(name, texts, "input", remote_images(request))
    parts = await infer_in_parts(request, model, name, batch)
    vectors = np.concatenate([p["EMBEDDING"] for p in parts]).astype(np.float32)
    if body.dimensions is not None and body.dimensions != vectors.shape[1]:
        raise bad_request(
            f"dimensions {body.dimensions}: this model's embeddings have {vectors.shape[1]}",
            param="dimensions",
        )
    tokens = int(sum(int(p["TOKENS"].sum()) for p in parts if p.get("TOKENS") is not None))
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
            if body.encoding_format == "base64"
            else v,
        }
        for i, v in enumerate(vectors)
    ]
    return Json(
        {
            "object": "list",
            "data": data,
            "model": model.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )
