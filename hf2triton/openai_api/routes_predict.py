"""/predict (and /v1/predict): a classifier's labels with their scores, the best first, in
text-embeddings-inference's shape. A text classifier's `inputs` are texts; an image
classifier's are images, each a base64 data URI (or bare base64) of the image file."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request

from .bodies import Json, input_array, parse, read_json
from .errors import bad_request
from .schemas import PredictRequest
from .state import only_model, remote_images, timed, triton_of

router = APIRouter()
# The classifiers' kinds: the input their items go to.
CLASSIFIERS = {"classification": "TEXT", "image_classification": "IMAGE"}


@router.post("/predict")
@router.post("/v1/predict")
async def predict(request: Request) -> Json:
    body = parse(PredictRequest, await read_json(request))
    model_name = body.model or await only_model(request, *CLASSIFIERS)
    request.state.model = model_name
    triton = triton_of(request)
    model = await triton.model(model_name, tuple(CLASSIFIERS), "/predict")
    items = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not items:
        raise bad_request("inputs is empty: send at least one item", param="inputs")
    name = CLASSIFIERS[model.kind]
    batch = await input_array(name, items, "inputs", remote_images(request))
    out = await timed(request, triton.infer(model, {name: batch}))
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
