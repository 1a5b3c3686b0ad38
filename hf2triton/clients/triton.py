"""A Triton server as the pipeline talks to it: the model-control API (load, unload, repository
index, readiness) and inference over gRPC or HTTP. Failures become hf2triton errors by exception
type and status code: a server that does not answer, or answers 5xx / UNAVAILABLE, is a
`ServiceUnavailableError` (worth a retry); anything else is the caller's error type.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any

import numpy as np

from hf2triton.errors import Hf2TritonError, ServiceUnavailableError
from hf2triton.waiting import wait_until

# gRPC status codes a second try can get past.
TRANSIENT_GRPC = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED",
                  "StatusCode.RESOURCE_EXHAUSTED", "StatusCode.CANCELLED")
DTYPES = {np.dtype(np.object_): "BYTES", np.dtype(np.int32): "INT32",
          np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32", np.dtype(np.bool_): "BOOL"}


def is_transient(exc: BaseException) -> bool:
    """Does this tritonclient failure say the server is down or busy (not that we asked wrong)?"""
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, InferenceServerException):
        status = str(exc.status() or "")
        return status in TRANSIENT_GRPC or (status.isdigit() and int(status) >= 500)
    return isinstance(exc, (OSError, ConnectionError, TimeoutError))


def classify(exc: BaseException, what: str, error: type[Hf2TritonError]) -> Hf2TritonError:
    """`exc` of a call to Triton as an hf2triton error: transient, or `error`."""
    from tritonclient.utils import InferenceServerException

    text = exc.message() if isinstance(exc, InferenceServerException) else str(exc)
    text = " ".join(str(text).split())[:500]
    if is_transient(exc):
        return ServiceUnavailableError(f"Triton did not answer while trying to {what}: {text}")
    return error(f"Triton refused to {what}: {text}")


class TritonAdmin:
    """The HTTP model-control API of one Triton server (explicit model-control mode)."""

    def __init__(self, url: str, timeout_s: float = 600.0):
        import tritonclient.http as httpclient

        self.url = url
        self.client = httpclient.InferenceServerClient(url=url, network_timeout=timeout_s)

    def close(self) -> None:
        # An open connection holds the server's shutdown for its exit timeout.
        self.client.close()

    def __enter__(self) -> TritonAdmin:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def live(self) -> bool:
        try:
            return bool(self.client.is_server_live())
        except Exception:  # noqa: BLE001 - any failure to answer is "not live"
            return False

    def index(self) -> list[dict[str, Any]]:
        return self.client.get_model_repository_index()

    def serving_versions(self, model: str) -> list[str]:
        """Versions of `model` the server reports READY."""
        return sorted((str(m["version"]) for m in self.index()
                       if m.get("name") == model and m.get("state") == "READY"
                       and m.get("version")), key=int)

    def state(self, model: str, version: str) -> tuple[str, str]:
        """(state, reason) of one version in the repository index ('' when not listed)."""
        for m in self.index():
            if m.get("name") == model and str(m.get("version", "")) == version:
                return str(m.get("state", "")), str(m.get("reason", ""))
        return "", ""

    def load(self, model: str) -> None:
        """Load the versions the model's version policy lists (new ones beside the loaded)."""
        self.client.load_model(model)

    def unload(self, model: str) -> None:
        self.client.unload_model(model)

    def wait_ready(self, model: str, version: str, timeout_s: float) -> bool:
        return wait_until(lambda: self.client.is_model_ready(model, version), timeout_s)

    def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        return self.client.get_model_config(model, version)


def _module(protocol: str) -> Any:
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    return module


def infer_inputs(module: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
    inputs = []
    for name, arr in arrays.items():
        x = module.InferInput(name, list(arr.shape), DTYPES[arr.dtype])
        x.set_data_from_numpy(arr)
        inputs.append(x)
    return inputs


class Inference:
    """Requests to one model version over gRPC or HTTP, with their latencies."""

    def __init__(self, protocol: str, url: str, model: str, version: str = "",
                 outputs: tuple[str, ...] = ()):
        self.module = _module(protocol)
        self.protocol, self.url, self.model, self.version = protocol, url, model, version
        self.outputs = outputs
        self.client = self.module.InferenceServerClient(url=url)
        self.latencies_ms: list[float] = []

    def wait_ready(self, timeout_s: float = 60) -> None:
        if not wait_until(lambda: self.client.is_model_ready(self.model, self.version),
                          timeout_s):
            raise ServiceUnavailableError(
                f"{self.model} version {self.version or '(latest)'} is not ready on {self.url} "
                f"({self.protocol}) after {timeout_s:.0f}s")

    def __call__(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        started = time.perf_counter()
        res = self.client.infer(self.model, infer_inputs(self.module, arrays),
                                model_version=self.version)
        self.latencies_ms.append((time.perf_counter() - started) * 1000)
        return {name: res.as_numpy(name) for name in self.outputs}

    def close(self) -> None:
        self.client.close()


@contextmanager
def inference(protocol: str, url: str, model: str, version: str = "",
              outputs: tuple[str, ...] = ()):
    session = Inference(protocol, url, model, version, outputs)
    try:
        yield session
    finally:
        session.close()
