"""hf2triton/openai_api/routes_ranking.py: /v1/rerank (Cohere's and Jina's shape) and /rerank
(text-embeddings-inference's): documents ordered by score, top_n of them, with their text when
asked; the one reranker served when the request names none. Driven through the app with
test_routes' stand-in (a passage's score is its length)."""

from __future__ import annotations

from tests.openai_api.test_routes import client, error_of

DOCS = ["bb", "a", "dddd", "ccc"]


def test_documents_come_back_best_first_with_their_index_and_score():
    api, _ = client()
    body = api.post("/v1/rerank", json={"model": "rr", "query": "q", "documents": DOCS}).json()
    assert [(r["index"], r["relevance_score"]) for r in body["results"]] == [
        (2, 4.0),
        (3, 3.0),
        (0, 2.0),
        (1, 1.0),
    ]
    assert body["model"] == "rr" and body["id"].startswith("rerank-")
    assert all("document" not in r for r in body["results"])


def test_top_n_and_documents_given_as_objects_returned_with_their_text():
    api, _ = client()
    docs = [{"text": d} for d in DOCS]
    body = api.post(
        "/v1/rerank",
        json={"model": "rr", "query": "q", "documents": docs, "top_n": 2, "return_documents": True},
    ).json()
    assert [r["document"] for r in body["results"]] == [{"text": "dddd"}, {"text": "ccc"}]


def test_teis_shape_names_no_model_and_gets_a_list_of_scores():
    api, _ = client()
    got = api.post("/rerank", json={"query": "q", "texts": DOCS[:2]}).json()
    assert got == [{"index": 0, "score": 2.0}, {"index": 1, "score": 1.0}]


def test_bad_documents_are_refused_naming_them():
    api, _ = client()
    error = error_of(
        api.post("/v1/rerank", json={"model": "rr", "query": "q", "documents": [{"title": "x"}]}),
        400,
    )
    assert error["param"] == "documents" and '{"text": ...}' in error["message"]
    error = error_of(
        api.post("/v1/rerank", json={"model": "rr", "query": "q", "documents": []}), 400
    )
    assert error["param"] == "documents"
    error = error_of(
        api.post("/v1/rerank", json={"model": "emb", "query": "q", "documents": DOCS}), 400
    )
    assert error["param"] == "model"
    error = error_of(api.post("/v1/rerank", json=["not", "an", "object"]), 400)
    assert error["message"] == "The body must be a JSON object"
