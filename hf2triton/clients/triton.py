"""A Triton server as the pipeline talks to it: the model-control API (load, unload, repository
index, liveness and readiness), inference over gRPC or HTTP (one request at a time, or many
concurrent ones on one asyncio channel) and its Prometheus metrics. The one place that reaches
Triton: failures become hf2triton errors by exception type and status code, a server that does
not answer, or answers 5xx / UNAVAILABLE, is a `ServiceUnavailableError` (worth a retry);
anything else is the caller's error type.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from hf2triton.errors import DeployError, Hf2TritonError, ServiceUnavailableError
from hf2triton.util.waiting import wait_for, wait_until

# gRPC status codes a second try can get past.
TRANSIENT_GRPC = (
    "StatusCode.UNAVAILABLE",
    "StatusCode.DEADLINE_EXCEEDED",
    "StatusCode.RESOURCE_EXHAUSTED",
    "StatusCode.CANCELLED",
)
DTYPES = {
    np.dtype(np.object_): "BYTES",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float32): "FP32",
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint64): "UINT64",
}


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

    def ready(self) -> bool:
        """Whether the server is ready (every model it was asked to load loaded)."""
        try:
            return bool(self.client.is_server_ready())
        except Exception:  # noqa: BLE001 - any failure to answer is "not ready"
            return False

    def model_ready(self, model: str, version: str = "") -> bool:
        try:
            return bool(self.client.is_model_ready(model, version))
        except Exception:  # noqa: BLE001 - any failure to answer is "not ready"
            return False

    def wait_live(self, timeout_s: float, what: str, proc: Any = None) -> None:
        """Until the server answers; `what` names it in the TimeoutError (and fails early when
        the process `proc` exits)."""
        wait_for(self.live, timeout_s, what, proc)

    def index(self) -> list[dict[str, Any]]:
        try:
            return self.client.get_model_repository_index()
        except Exception as exc:  # noqa: BLE001 - classified by type and status
            raise classify(exc, "read the model repository index", DeployError) from None

    def serving_versions(self, model: str) -> list[str]:
        """Versions of `model` the server reports READY."""
        return sorted(
            (
                str(m["version"])
                for m in self.index()
                if m.get("name") == model and m.get("state") == "READY" and m.get("version")
            ),
            key=int,
        )

    def state(self, model: str, version: str) -> tuple[str, str]:
        """(state, reason) of one version in the repository index ('' when not listed)."""
        for m in self.index():
            if m.get("name") == model and str(m.get("version", "")) == version:
                return str(m.get("state", "")), str(m.get("reason", ""))
        return "", ""

    def load(self, model: str) -> None:
        """Load the versions the model's version policy lists (new ones beside the loaded)."""
        try:
            self.client.load_model(model)
        except Exception as exc:  # noqa: BLE001 - classified by type and status
            raise classify(exc, f"load {model}", DeployError) from None

    def unload(self, model: str) -> None:
        try:
            self.client.unload_model(model)
        except Exception as exc:  # noqa: BLE001 - classified by type and status
            raise classify(exc, f"unload {model}", DeployError) from None

    def wait_ready(self, model: str, version: str, timeout_s: float) -> bool:
        return wait_until(lambda: self.model_ready(model, version), timeout_s)

    def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        return self.client.get_model_config(model, version)


def _module(protocol: str) -> Any:
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    return module


def joined(pieces: list[np.ndarray]) -> np.ndarray:
    """An output sent piece by piece (a stream's text or ids), whole again: [1, ...] rows."""
    if pieces[0].dtype == np.object_:
        return np.array([[b"".join(p.reshape(-1)[0] for p in pieces)]], dtype=np.object_)
    return np.concatenate(pieces, axis=1)


def infer_inputs(module: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
    inputs = []
    for name, arr in arrays.items():
        x = module.InferInput(name, list(arr.shape), DTYPES[arr.dtype])
        x.set_data_from_numpy(arr)
        inputs.append(x)
    return inputs


@dataclass(frozen=True)
class Failure:
    """How a session reports a request that failed: the error type it raises (unless the server
    did not answer: ServiceUnavailableError) and what the request was to do, for the message."""

    error: type[Hf2TritonError] = DeployError
    what: str = "answer a request"


class Inference:
    """Requests to one model version over gRPC or HTTP, with their latencies; a failed request
    raises `failure.error` (or ServiceUnavailableError, when the server did not answer) saying
    that it failed to `failure.what`."""

    def __init__(
        self,
        protocol: str,
        url: str,
        model: str,
        version: str = "",
        outputs: tuple[str, ...] = (),
        failure: Failure = Failure(),
    ):
        self.module = _module(protocol)
        self.protocol, self.url, self.model, self.version = protocol, url, model, version
        self.outputs, self.error, self.what = outputs, failure.error, failure.what
        self.client = self.module.InferenceServerClient(url=url)
        self.latencies_ms: list[float] = []
        self.decoupled: bool | None = None  # known at the first request

    def wait_ready(self, timeout_s: float = 60) -> None:
        if not wait_until(lambda: self.client.is_model_ready(self.model, self.version), timeout_s):
            raise ServiceUnavailableError(
                f"{self.model} version {self.version or '(latest)'} is not ready on {self.url} "
                f"({self.protocol}) after {timeout_s:.0f}s"
            )

    def __call__(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return self._call(arrays)
        except Hf2TritonError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified by type and status
            raise classify(exc, self.what, self.error) from None

    def _call(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.decoupled is None:
            cfg = self.client.get_model_config(self.model, self.version)
            policy = (
                cfg.config.model_transaction_policy.decoupled
                if self.protocol == "grpc"
                else cfg.get("model_transaction_policy", {}).get("decoupled", False)
            )
            self.decoupled = bool(policy)
        started = time.perf_counter()
        if self.decoupled:  # Triton answers a decoupled model over a gRPC stream or `generate`
            out = self._stream(arrays) if self.protocol == "grpc" else self._generate(arrays)
        else:
            res = self.client.infer(
                self.model, infer_inputs(self.module, arrays), model_version=self.version
            )
            out = {name: res.as_numpy(name) for name in self.outputs}
        self.latencies_ms.append((time.perf_counter() - started) * 1000)
        return out

    def _stream(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every response of one request over a gRPC stream: string and id outputs joined
        piece by piece, the others as the final response has them."""
        import queue

        got: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: got.put((result, error)))
        try:
            self.client.async_stream_infer(
                self.model,
                infer_inputs(self.module, arrays),
                model_version=self.version,
                enable_empty_final_response=True,
            )
            parts: dict[str, list[np.ndarray]] = {}
            while True:
                result, error = got.get(timeout=600)
                if error is not None:
                    raise error
                for name in self.outputs:
                    value = result.as_numpy(name)
                    if value is not None:
                        parts.setdefault(name, []).append(value)
                params = result.get_response().parameters
                if params["triton_final_response"].bool_param:
                    break
        finally:
            self.client.stop_stream()
        return {name: v[0] if len(v) == 1 else joined(v) for name, v in parts.items()}

    def _generate(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One request (one row) through HTTP `generate`: its JSON answer as [1, n] arrays."""
        import json
        import urllib.error
        import urllib.request

        from tritonclient.utils import InferenceServerException

        body = {
            k: (
                v.reshape(-1)[0].decode("utf-8")
                if v.dtype == np.object_
                else v.reshape(-1)[0].item()
            )
            for k, v in arrays.items()
        }
        version = f"/versions/{self.version}" if self.version else ""
        req = urllib.request.Request(
            f"http://{self.url}/v2/models/{self.model}{version}/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise InferenceServerException(
                exc.read().decode(errors="replace"), status=str(exc.code)
            ) from None
        out = {}
        for name in self.outputs:
            value = answer.get(name)
            if value is not None:
                out[name] = np.array(
                    [value if isinstance(value, list) else [value]],
                    dtype=np.object_ if isinstance(value, str) else None,
                )
        if "text_output" in out:
            out["text_output"] = np.array(
                [[answer["text_output"].encode("utf-8")]], dtype=np.object_
            )
        return out

    def close(self) -> None:
        self.client.close()


@contextmanager
def inference(
    protocol: str,
    url: str,
    model: str,
    version: str = "",
    outputs: tuple[str, ...] = (),
    failure: Failure = Failure(),
):
    session = Inference(protocol, url, model, version, outputs, failure)
    try:
        yield session
    finally:
        session.close()


class TritonGrpc:
    """A Triton model over gRPC as an asyncio `call` (hf2triton.release.load): one channel, many
    concurrent requests on it; each payload is a request's input arrays by name."""

    def __init__(self, url: str, model: str, version: str = "", outputs: tuple[str, ...] = ()):
        import tritonclient.grpc.aio as grpcaio

        self.module = grpcaio
        self.client = grpcaio.InferenceServerClient(url)
        self.model, self.version = model, version
        self.outputs = [grpcaio.InferRequestedOutput(name) for name in outputs] or None

    async def __call__(self, arrays: dict[str, np.ndarray]) -> Any:
        return await self.client.infer(
            self.model,
            infer_inputs(self.module, arrays),
            model_version=self.version,
            outputs=self.outputs,
        )

    async def close(self) -> None:
        await self.client.close()


def metrics_text(metrics_url: str, timeout_s: float = 10) -> str:
    """Triton's Prometheus metrics (http://host:port/metrics), as text."""
    import urllib.request

    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as r:
            return r.read().decode("utf-8", "replace")
    except OSError as exc:
        raise ServiceUnavailableError(
            f"Triton's metrics at {metrics_url} did not answer: "
            f"{exc}; is the server running (`hf2triton server "
            "status`)?"
        ) from None
