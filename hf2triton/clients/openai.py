"""The OpenAI-compatible API beside a Triton (hf2triton/openai_api) as the smoke test and the
watch ask it: one model version, the kind's requests mapped onto the kind's route
(`ModelKind.openai_body`) and the answers back onto its Triton outputs (`openai_answer`), so the
gate's own metrics and limits judge what the API returns. A refused request raises
`failure.error` with the API's error object's message."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from hf2triton.clients.triton import Failure
from hf2triton.errors import ServiceUnavailableError
from hf2triton.util.waiting import wait_until

# A kind's resolved config: the client only hands it back to the kind's `openai_answer`.
C = TypeVar("C")
C_contra = TypeVar("C_contra", contravariant=True)


class OpenAIKind(Protocol[C_contra]):
    """What the client asks of a model kind (hf2triton.kinds.base.ModelKind): its route, and
    how a Triton request goes onto it and the answer comes back."""

    @property
    def openai_route(self) -> str | None: ...

    def openai_body(self, request: dict[str, np.ndarray]) -> dict[str, Any]: ...

    def openai_answer(
        self, body: dict[str, Any], request: dict[str, np.ndarray], cfg: C_contra
    ) -> dict[str, np.ndarray]: ...


def encoded(body: dict[str, Any] | None) -> tuple[bytes | None, str]:
    """A request body and its content type: JSON, or a multipart/form-data upload when a value
    is a file's bytes (the audio routes)."""
    if body is None or not any(isinstance(v, bytes) for v in body.values()):
        return (None if body is None else json.dumps(body).encode()), "application/json"
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in body.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"'
        if isinstance(value, bytes):
            head += f'; filename="{name}"\r\nContent-Type: application/octet-stream'
        else:
            value = str(value).encode("utf-8")
        parts.append(head.encode() + b"\r\n\r\n" + value + b"\r\n")
    data = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return data, f"multipart/form-data; boundary={boundary}"


@dataclass(frozen=True)
class OpenAIApi:
    """Where the API is (http://host:port/v1) and the key it wants (None: it wants none)."""

    base_url: str
    api_key: str | None = None


class OpenAIInference(Generic[C]):
    """`__call__(arrays)` like `clients.triton.Inference`, through the API at `api` for `model`
    (`name:version` when `version` is given): `kind` maps the requests, `cfg` is its config."""

    protocol = "openai"
    timeout_s: float = 600  # a request's, unless the call says otherwise

    def __init__(
        self,
        api: OpenAIApi,
        model: str,
        version: str,
        kind: OpenAIKind[C],
        cfg: C,
        failure: Failure,
    ):
        self.url, self.key, self.kind, self.cfg = api.base_url.rstrip("/"), api.api_key, kind, cfg
        self.model = f"{model}:{version}" if version else model
        self.error, self.what = failure.error, failure.what
        self.latencies_ms: list[float] = []

    def _request(
        self, path: str, body: dict[str, Any] | None = None, timeout_s: float = 0
    ) -> tuple[int, Any]:
        # /predict is text-embeddings-inference's route: at the root, not under /v1.
        url = self.url.removesuffix("/v1") + path if path == "/predict" else self.url + path
        data, content_type = encoded(body)
        headers = {"Content-Type": content_type}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        req = urllib.request.Request(url, headers=headers, data=data)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read())
            except ValueError:
                return exc.code, {"error": {"message": f"HTTP {exc.code} {exc.reason}"}}
        except OSError as exc:
            raise ServiceUnavailableError(
                f"the OpenAI-compatible API at {self.url} did not answer ({self.what}): {exc}"
            ) from None

    def wait_ready(self, timeout_s: float = 60) -> None:
        """Until the API answers and reaches the model."""

        def ready() -> bool:
            try:
                status, body = self._request("/models", timeout_s=5)
            except ServiceUnavailableError:
                return False
            name = self.model.split(":")[0]
            return status == 200 and any(m.get("id") == name for m in body.get("data", []))

        if not wait_until(ready, timeout_s):
            raise ServiceUnavailableError(
                f"the OpenAI-compatible API at {self.url} does not "
                f"list {self.model} after {timeout_s:.0f}s"
            )

    def __call__(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        body = {"model": self.model, **self.kind.openai_body(arrays)}
        started = time.perf_counter()
        status, answer = self._request(self.kind.openai_route or "", body)
        if status != 200:
            error = answer.get("error", {}) if isinstance(answer, dict) else {}
            cls = ServiceUnavailableError if status in (502, 503, 504) else self.error
            raise cls(
                f"the OpenAI-compatible API at {self.url} failed to {self.what}: HTTP "
                f"{status} {error.get('message', answer)}"
            )
        self.latencies_ms.append((time.perf_counter() - started) * 1000)
        return self.kind.openai_answer(answer, arrays, self.cfg)

    def close(self) -> None:
        pass
