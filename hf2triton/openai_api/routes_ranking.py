"""/v1/rerank and /rerank: a reranker's scores of documents against a query, in Cohere's and
Jina's shape, or text-embeddings-inference's (`texts` in, a list of scores out)."""

from __future__ import annotations

import uuid

import numpy as np
from fastapi import APIRouter, Request

from .bodies import Json, parse, read_json, text_array
from .errors import bad_request
from .schemas import RerankRequest
from .state import only_model, timed, triton_of

router = APIRouter()


@router.post("/v1/rerank")
@router.post("/rerank")
async def rerank(request: Request) -> Json:
    raw = await read_json(request)
    tei = "texts" in raw and "documents" not in raw  # text-embeddings-inference's shape
    if tei:
        raw = {
            **raw,
            "documents": raw.pop("texts"),
            "return_documents": raw.pop("return_text", False),
        }
    if not raw.get("model"):  # text-embeddings-inference's requests name none
        raw["model"] = await only_model(request, "reranking")
    body = parse(RerankRequest, raw)
    request.state.model = body.model
    triton = triton_of(request)
    model = await triton.model(body.model, ("reranking",), "/v1/rerank")
    try:
        docs = body.texts()
    except ValueError as exc:
        raise bad_request(str(exc), param="documents") from None
    passages = np.array([[d.encode("utf-8") for d in docs]], dtype=np.object_)
    out = await timed(
        request,
        triton.infer(
            model, {"QUERY": text_array(body.query), "PASSAGES": passages}, prompt_param="query"
        ),
    )
    scores = out["SCORES"][0]
    order = np.argsort(-scores, kind="stable")[: body.top_n or len(docs)]
    if tei:
        return Json(
            [
                {
                    "index": int(i),
                    "score": float(scores[i]),
                    **({"text": docs[i]} if body.return_documents else {}),
                }
                for i in order
            ]
        )
    results = [
        {
            "index": int(i),
            "relevance_score": float(scores[i]),
            **({"document": {"text": docs[i]}} if body.return_documents else {}),
        }
        for i in order
    ]
    return Json({"id": f"rerank-{uuid.uuid4().hex}", "model": model.name, "results": results})
