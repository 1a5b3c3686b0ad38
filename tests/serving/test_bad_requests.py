"""Bad input to the served model: each bad request gets a clear error while the server keeps
answering good requests sent at the same time (a real Triton serving a tiny released model)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hf2triton.kinds.embedding import TorchEmbedder, cosine_rows, resolve_embedding_config

GOOD = ["the quick brown fox", "thanks a lot", "the bank raised interest rates"]


def _infer(url: str, model: str, texts, *, name="TEXT", dtype="BYTES", shape=None):
    client = grpcclient.InferenceServerClient(url=url)
    if dtype == "BYTES":
        data = np.array(
            [[t if isinstance(t, bytes) else t.encode()] for t in texts], dtype=np.object_
        )
    else:
        data = np.zeros((len(texts), 1), dtype=np.float32)
    if shape is not None:
        data = data.reshape(shape)
    inp = grpcclient.InferInput(name, list(data.shape), dtype)
    inp.set_data_from_numpy(data)
    res = client.infer(model, [inp])
    return res.as_numpy("EMBEDDING"), res.as_numpy("TRUNCATED")


@pytest.fixture(scope="module")
def reference(tiny_bert):
    return TorchEmbedder(tiny_bert, resolve_embedding_config(tiny_bert))


def test_empty_string_is_embedded(tiny_release, reference):
    emb, truncated = _infer(tiny_release.grpc_url, tiny_release.model, [""])
    assert emb.shape == (1, 32) and np.isfinite(emb).all()
    assert cosine_rows(reference.embed([""]), emb)[0] >= 0.98
    assert not truncated.any()


def test_text_beyond_max_length_is_truncated_and_says_so(tiny_release, reference):
    long_text = "the quick brown fox jumps over the lazy dog " * 200
    emb, truncated = _infer(tiny_release.grpc_url, tiny_release.model, [long_text, "short"])
    assert truncated[:, 0].tolist() == [True, False]
    assert cosine_rows(reference.embed([long_text]), emb[:1])[0] >= 0.98


BAD_REQUESTS = {
    "not utf-8": (dict(texts=[b"\xff\xfe broken"]), "not valid UTF-8"),
    "batch above max_batch_size": (dict(texts=["x"] * 9), "batch"),
    "wrong input name": (dict(texts=["x"], name="SENTENCE"), "SENTENCE"),
    "wrong type": (dict(texts=["x"], dtype="FP32"), "TYPE"),
    "wrong shape": (dict(texts=["x", "y"], shape=(1, 2)), "shape"),
}


CLIENTS = 8


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=list(BAD_REQUESTS))
def test_bad_request_gets_clear_error_while_good_requests_succeed(tiny_release, reference, case):
    """Eight clients send good requests before, while and after the bad ones are refused: every
    good request is answered correctly, including one from each client sent after the last bad
    request."""
    kwargs, expected = BAD_REQUESTS[case]
    expected_emb = reference.embed(GOOD)
    all_answering = threading.Barrier(CLIENTS + 1)
    bad_done = threading.Event()
    answers, failures = [], []

    def good_client():
        first = True
        while True:
            after = bad_done.is_set()
            try:
                emb, _ = _infer(tiny_release.grpc_url, tiny_release.model, GOOD)
                answers.append((after, float(cosine_rows(expected_emb, emb).min())))
            except Exception as exc:  # a failed good request is the outcome under test
                failures.append(repr(exc))
            if first:
                first = False
                all_answering.wait()
            if after:
                return

    with ThreadPoolExecutor(CLIENTS) as pool:
        clients = [pool.submit(good_client) for _ in range(CLIENTS)]
        all_answering.wait()  # every client has had a request answered: they are all running
        errors = []
        try:
            for _ in range(5):
                with pytest.raises(InferenceServerException) as info:
                    _infer(tiny_release.grpc_url, tiny_release.model, **kwargs)
                errors.append(str(info.value))
        finally:
            bad_done.set()
        for client in clients:
            client.result()
    assert not failures, failures[:3]
    assert min(cos for _, cos in answers) >= 0.98
    assert sum(after for after, _ in answers) == CLIENTS  # the server still answers afterwards
    assert all(expected.lower() in e.lower() for e in errors), errors[0]


def test_http_clients_get_the_same_embeddings_as_grpc(tiny_release):
    client = httpclient.InferenceServerClient(url=tiny_release.http_url)
    inp = httpclient.InferInput("TEXT", [len(GOOD), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[t.encode()] for t in GOOD], dtype=np.object_))
    http_emb = client.infer(tiny_release.model, [inp]).as_numpy("EMBEDDING")
    grpc_emb, _ = _infer(tiny_release.grpc_url, tiny_release.model, GOOD)
    assert np.allclose(http_emb, grpc_emb, atol=1e-5)
