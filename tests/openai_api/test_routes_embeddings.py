"""hf2triton/openai_api/routes_embeddings.py: /v1/embeddings in batches of the model's size, every
text's vector in order, as floats or base64, the tokens embedded as usage; a size the model does
not make is refused before any inference. Driven through the app with test_routes' stand-in."""

from __future__ import annotations

import base64

import numpy as np

from tests.openai_api.test_routes import client, error_of


def test_every_text_gets_its_vector_in_order_from_batches_of_the_models_size():
    api, fake = client()
    texts = [f"{'w ' * i}x" for i in range(5)]
    body = api.post("/v1/embeddings", json={"model": "emb", "input": texts}).json()
    assert fake.batches == [2, 2, 1]  # max_batch_size 2
    assert [d["embedding"][0] for d in body["data"]] == [float(len(t)) for t in texts]
    assert [d["index"] for d in body["data"]] == list(range(5))
    assert {d["object"] for d in body["data"]} == {"embedding"} and body["object"] == "list"
    tokens = sum(len(t.split()) + 2 for t in texts)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_base64_is_little_endian_float32_of_the_same_vector():
    api, _ = client()
    plain = api.post("/v1/embeddings", json={"model": "emb", "input": "abc"}).json()
    packed = api.post(
        "/v1/embeddings", json={"model": "emb", "input": "abc", "encoding_format": "base64"}
    ).json()
    vector = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), "<f4")
    assert vector.tolist() == plain["data"][0]["embedding"] == [3.0, 1.0, 2.0, 3.0]


def test_the_models_own_size_is_taken_and_another_refused_before_inference():
    api, fake = client()
    ok = api.post("/v1/embeddings", json={"model": "emb", "input": "x", "dimensions": 4})
    assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 4
    fake.batches.clear()
    error = error_of(
        api.post("/v1/embeddings", json={"model": "emb", "input": "x", "dimensions": 3}), 400
    )
    assert (
        error["param"] == "dimensions"
        and error["message"] == "dimensions 3: this model's embeddings have 4"
    )
    assert fake.batches == []


def test_images_sent_to_a_text_embedder_are_refused_naming_the_modality():
    api, fake = client()
    body = {"model": "emb", "input": ["data:image/png;base64,iVBORw0KGgo="], "modality": "image"}
    error = error_of(api.post("/v1/embeddings", json=body), 400)
    assert error["param"] == "modality" and "embeds texts only" in error["message"]
    assert fake.batches == []
