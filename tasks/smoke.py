"""Smoke step: query the deployed endpoint over gRPC and HTTP with real sentences and compare the
served embeddings with the original PyTorch model's, using the release's cosine gate.
"""

from __future__ import annotations

import time
from typing import TypedDict

import numpy as np
from prefect import task

from hf2triton.embeddings import cosine_rows
from hf2triton.errors import ServiceUnavailableError, SmokeTestError
from tasks.common import NO_PREFECT_CACHE, RETRY_TRANSIENT


class SmokeResult(TypedDict):
    sentences: int
    grpc_min_cosine: float
    http_min_cosine: float
    grpc_p50_ms: float
    http_p50_ms: float
    batch_min_cosine: float


def _text_input(module, texts: list[str]):
    data = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
    inp = module.InferInput("TEXT", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    return inp


def embed_remote(protocol: str, url: str, model: str, version: str, texts: list[str],
                 timeout_s: float = 60) -> tuple[np.ndarray, list[float]]:
    """Embed each text as its own request; returns embeddings and per-request latency (ms)."""
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    client = module.InferenceServerClient(url=url)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if client.is_model_ready(model, version):
                break
        except Exception:  # not up yet: tritonclient raises several types while connecting
            pass
        if time.monotonic() > deadline:
            raise ServiceUnavailableError(
                f"{model} version {version} is not ready on {url} ({protocol}) after "
                f"{timeout_s:.0f}s"
            )
        time.sleep(0.5)
    out, latency = [], []
    for text in texts:
        started = time.perf_counter()
        res = client.infer(model, [_text_input(module, [text])], model_version=version)
        latency.append((time.perf_counter() - started) * 1000)
        out.append(res.as_numpy("EMBEDDING")[0])
    client.close()
    return np.stack(out), latency


def smoke_test(grpc_url: str, http_url: str, model_name: str, version: str,
               reference_path: str, min_cosine: float, max_batch_size: int = 64) -> SmokeResult:
    """Fail unless every served embedding is within `min_cosine` of the PyTorch reference."""
    if reference_path.endswith(".json"):  # text-classification and translation releases
        from tasks.smoke_tasks import smoke_task

        return smoke_task(grpc_url, http_url, model_name, version, reference_path,
                          max_batch_size)
    ref = np.load(reference_path, allow_pickle=True)
    texts, expected = [str(t) for t in ref["texts"]], ref["embeddings"]
    from tritonclient.utils import InferenceServerException

    try:
        grpc_emb, grpc_ms = embed_remote("grpc", grpc_url, model_name, version, texts)
        http_emb, http_ms = embed_remote("http", http_url, model_name, version, texts)
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(url=grpc_url)
        batch = np.concatenate([
            client.infer(model_name, [_text_input(grpcclient, texts[i:i + max_batch_size])],
                         model_version=version).as_numpy("EMBEDDING")
            for i in range(0, len(texts), max_batch_size)
        ])
        client.close()  # an open connection holds the server's shutdown for its exit timeout
    except InferenceServerException as exc:
        raise SmokeTestError(
            f"{model_name} version {version} failed a smoke request: {exc}"
        ) from None
    result = SmokeResult(
        sentences=len(texts),
        grpc_min_cosine=float(cosine_rows(expected, grpc_emb).min()),
        http_min_cosine=float(cosine_rows(expected, http_emb).min()),
        batch_min_cosine=float(cosine_rows(expected, batch).min()),
        grpc_p50_ms=float(np.median(grpc_ms)),
        http_p50_ms=float(np.median(http_ms)),
    )
    worst = min(result["grpc_min_cosine"], result["http_min_cosine"], result["batch_min_cosine"])
    if not worst >= min_cosine:  # NaN served embeddings fail too
        cos = cosine_rows(expected, grpc_emb)
        i = int(np.argmin(cos))
        raise SmokeTestError(
            f"served embeddings of {model_name} version {version} differ from PyTorch: min "
            f"cosine {worst:.6f} < {min_cosine} (worst sentence {texts[i][:40]!r} at "
            f"{cos[i]:.6f}); champion was not moved"
        )
    return result


smoke = task(smoke_test, name="smoke", task_run_name="smoke {model_name} v{version}",
             **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
