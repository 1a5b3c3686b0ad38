"""/predict (and /v1/predict): a classifier's labels with their scores, the best first, in
text-embeddings-inference's shape."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request

from .bodies import Json, parse, read_json, texts_array
from .errors import bad_request
from .schemas import PredictRequest
from .state import only_model, timed, triton_of

router = APIRouter()


@router.post("/predict")
@router.post("/v1/predict")
async def predict(request: Request) -> Json:
    body = parse(PredictRequest, await read_json(request))
    model_name = body.model or await only_model(request, "classification")
    request.state.model = model_name
    triton = triton_of(request)
    model = await triton.model(model_name, ("classification",), "/predict")
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not texts:
        raise bad_request("inputs is empty: send at least one text", param="inputs")
    out = await timed(request, triton.infer(model, {"TEXT": texts_array(texts)}))
    scores = out["SCORES"]
    names = (
        model.labels
        if len(model.labels) == scores.shape[1]
        else tuple(f"LABEL_{i}" for i in range(scores.shape[1]))
    )
    # text-embeddings-inference's answer: every label with its score, the best first.
    answers = [
        [{"label": names[j], "score": float(row[j])} for j in np.argsort(-row, kind="stable")]
        for row in scores
    ]
    return Json(answers[0] if isinstance(body.inputs, str) else answers)
