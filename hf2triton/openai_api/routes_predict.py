"""/predict (and /v1/predict): a classifier's labels with their scores, the best first, in
text-embeddings-inference's shape. A text classifier's `inputs` are texts; an image
classifier's are images, each a base64 data URI (or bare base64) of the image file. An
image-text embedder (CLIP) classifies images zero-shot against the request's `labels`: each
label made a text by `label_template`, the scores the softmax of the model's logit scale times
the cosines, as CLIP's own `logits_per_image`."""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import APIRouter, Request

from .bodies import Json, input_array, parse, read_json, texts_array
from .errors import bad_request
from .schemas import PredictRequest
from .state import infer_in_parts, only_model, remote_images, timed, triton_of
from .triton import Model

router = APIRouter()
# The classifiers' kinds: the input their items go to.
CLASSIFIERS = {
    "classification": "TEXT",
    "image_classification": "IMAGE",
    "image_text_embedding": "IMAGE",
}


@router.post("/predict")
@router.post("/v1/predict")
async def predict(request: Request) -> Json:
    body = parse(PredictRequest, await read_json(request))
    model_name = body.model or await only_model(request, *CLASSIFIERS)
    request.state.model = model_name
    model = await triton_of(request).model(model_name, tuple(CLASSIFIERS), "/predict")
    items = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not items:
        raise bad_request("inputs is empty: send at least one item", param="inputs")
    name = CLASSIFIERS[model.kind]
    batch = await input_array(name, items, "inputs", remote_images(request))
    if model.kind == "image_text_embedding":
        names, scores = await zero_shot(request, model, body, batch)
    else:
        scores = (await timed(request, triton_of(request).infer(model, {name: batch})))["SCORES"]
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


async def embed(request: Request, model: Model, name: str, batch: np.ndarray) -> np.ndarray:
    """The model's embeddings of a batch, sent in requests of its max_batch_size."""
    parts = await infer_in_parts(request, model, name, batch)
    return np.concatenate([p["EMBEDDING"] for p in parts]).astype(np.float32)


async def zero_shot(
    request: Request, model: Model, body: PredictRequest, images: np.ndarray
) -> tuple[tuple[str, ...], np.ndarray]:
    """Each image's score for each of the request's labels (CLIP's logits_per_image, softmax)."""
    if not body.labels:
        raise bad_request(
            f"labels: {model.name!r} is an image-text embedder: it classifies images against the "
            'labels a request gives ("labels": ["cat", "dog"])',
            param="labels",
        )
    if not model.logit_scale:
        raise bad_request(
            f"{model.name!r} was released before zero-shot classification: release it again",
            param="model",
        )
    prompts = [body.label_template.replace("{}", label) for label in body.labels]
    found = await asyncio.gather(
        embed(request, model, "IMAGE", images), embed(request, model, "TEXT", texts_array(prompts))
    )
    logits = model.logit_scale * (found[0] @ found[1].T)
    scores = np.exp(logits - logits.max(axis=1, keepdims=True))
    return tuple(body.labels), scores / scores.sum(axis=1, keepdims=True)
