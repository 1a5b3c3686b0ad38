"""What a test asks a served model, the way a user's client would (tritonclient over gRPC or
HTTP), and small readers shared by the test modules."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from hf2triton.kinds.base import read_lines
from hf2triton.waiting import wait_until


def read_sentences(path: str | Path) -> list[str]:
    return read_lines(path, "validation.sentences")


def triton_client(url: str):
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url=url, network_timeout=600.0)


def serving_versions(client, model: str) -> list[str]:
    """Versions of `model` a server's repository index lists READY."""
    return sorted((str(m["version"]) for m in client.get_model_repository_index()
                   if m.get("name") == model and m.get("state") == "READY" and m.get("version")),
                  key=int)


def embed_remote(protocol: str, url: str, model: str, version: str, texts: list[str],
                 timeout_s: float = 60) -> tuple[np.ndarray, list[float]]:
    """Embed each text as its own request; embeddings and per-request latency (ms)."""
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    client = module.InferenceServerClient(url=url)
    assert wait_until(lambda: client.is_model_ready(model, version), timeout_s), \
        f"{model} {version} not ready on {url}"
    out, latency = [], []
    for text in texts:
        x = module.InferInput("TEXT", [1, 1], "BYTES")
        x.set_data_from_numpy(np.array([[text.encode("utf-8")]], dtype=np.object_))
        started = time.perf_counter()
        res = client.infer(model, [x], model_version=version)
        latency.append((time.perf_counter() - started) * 1000)
        out.append(res.as_numpy("EMBEDDING")[0])
    client.close()
    return np.stack(out), latency
