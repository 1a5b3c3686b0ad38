"""The Triton server behind the API, over gRPC (asyncio): which models it serves, of which kind
(the `kind` parameter each release's config.pbtxt declares), and requests to them, streamed for
a decoupled model. Triton's refusals become API errors by status code."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .errors import ApiError, bad_request, not_found, param_of, unavailable

# Versions released before config.pbtxt declared its kind: the kind told by the tensors the
# serving classes of that time declared (hf2triton/serving/*.py). New kinds need no line here.
LEGACY_KINDS = (
    ("embedding", {"TEXT"}, {"EMBEDDING"}),
    ("text_generation", {"text_input"}, {"text_output"}),
    ("reranking", {"QUERY", "PASSAGES"}, {"SCORES"}),
    ("classification", {"TEXT"}, {"LABEL", "SCORES"}),
    ("image_classification", {"IMAGE"}, {"LABEL", "SCORES"}),
    ("translation", {"TEXT"}, {"TRANSLATION"}),
)
DTYPES = {
    np.dtype(np.object_): "BYTES",
    np.dtype(np.int32): "INT32",
    np.dtype(np.float32): "FP32",
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint64): "UINT64",
}
INDEX_TTL_S = 2.0  # how long the list of served models is trusted
VERSIONED = re.compile(r"^[^:]+:[0-9]+$")  # "name:3": version 3 of the model


@dataclass(frozen=True)
class Model:
    name: str
    version: str
    kind: str
    max_batch_size: int
    outputs: tuple[str, ...]
    created: int  # when the API first saw this version (seconds)
    labels: tuple[str, ...] = ()  # a classifier's label names, in score order
    width: int | None = None  # an embedder's embedding size, as its config declares it
    # How a text generator's chat template calls tools ("hermes", "json"; "": it takes none).
    chat_tools: str = ""
    # An image-text embedder's zero-shot temperature: its logits are this times the cosines.
    logit_scale: float = 0.0
    # The request named this version ("name:3"). Else Triton picks the newest ready version as
    # it answers: the one the index showed may be unloaded meanwhile (a rollback's switch).
    pinned: bool = False

    @property
    def asked_version(self) -> str:
        """The version sent to Triton ("": its newest ready one)."""
        return self.version if self.pinned else ""


def kind_of(cfg: dict[str, Any]) -> str | None:
    """A model's kind: its config's `kind` parameter, or (released before there was one) the
    kind its tensors tell."""
    declared = cfg.get("parameters", {}).get("kind", {}).get("string_value")
    if declared:
        return str(declared)
    inputs = {t["name"] for t in cfg.get("input", [])}
    outputs = {t["name"] for t in cfg.get("output", [])}
    for kind, needs_in, needs_out in LEGACY_KINDS:
        if needs_in <= inputs and needs_out <= outputs:
            return kind
    return None


class Triton:
    """One Triton server's gRPC endpoint."""

    def __init__(self, url: str):
        import tritonclient.grpc.aio as grpcaio

        self.grpc = grpcaio
        self.url = url
        self.client = grpcaio.InferenceServerClient(url)
        self.known: dict[tuple[str, str], Model] = {}
        self.index: tuple[float, list[dict[str, Any]]] = (0.0, [])

    async def close(self) -> None:
        await self.client.close()

    async def live(self) -> bool:
        try:
            return bool(await self.client.is_server_live())
        except Exception:  # noqa: BLE001 - any failure to answer is "not live"
            return False

    async def _index(self, fresh: bool = False) -> list[dict[str, Any]]:
        at, found = self.index
        if not fresh and time.monotonic() - at < INDEX_TTL_S:
            return found
        try:
            reply = await self.client.get_model_repository_index(as_json=True)
        except Exception as exc:  # noqa: BLE001 - a server that does not answer
            raise unavailable(f"Triton at {self.url} did not answer: {exc}") from None
        found = list(reply.get("models", []))
        self.index = (time.monotonic(), found)
        return found

    async def models(self) -> list[Model]:
        """Every model Triton serves now, at its newest ready version (the one unversioned
        requests reach)."""
        newest: dict[str, str] = {}
        for m in await self._index():
            if m.get("state") == "READY" and m.get("version"):
                v = str(m["version"])
                if m["name"] not in newest or int(v) > int(newest[m["name"]]):
                    newest[m["name"]] = v
        out = []
        for name, version in sorted(newest.items()):
            model = await self._describe(name, version)
            if model is not None:
                out.append(model)
        return out

    async def model(self, name: str, kinds: tuple[str, ...], route: str) -> Model:
        """The served model `name` ("name:3" for its version 3 while several serve; else the
        newest, the one Triton answers unversioned requests with), which must be of one of
        `kinds`: 404 when Triton has no such model, 503 while it is not ready, 400 when it is
        of another kind."""
        name, _, wanted = name.partition(":") if VERSIONED.match(name) else (name, "", "")
        found, ready = await self._listed(name, wanted)
        if not ready:  # the index kept may be older than a load that finished since
            found, ready = await self._listed(name, wanted, fresh=True)
        if not found:
            raise not_found(name)
        if not ready:
            states = ", ".join(
                sorted(
                    {
                        str(m.get("state"))
                        for m in found
                        if not wanted or str(m.get("version")) == wanted
                    }
                )
            )
            raise unavailable(
                f"The model '{name}'{' version ' + wanted if wanted else ''} is "
                f"not ready ({states or 'not loaded'}): try again shortly"
            )
        version = max((str(m["version"]) for m in ready), key=int)
        model = await self._describe(name, version)
        if model is None or model.kind not in kinds:
            raise bad_request(
                f"The model '{name}' is a {model.kind if model else 'non-hf2triton'}"
                f" model: {route} serves {' or '.join(kinds)} models",
                param="model",
                code="wrong_model_kind",
            )
        return replace(model, pinned=True) if wanted else model

    async def _listed(
        self, name: str, wanted: str, fresh: bool = False
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The index's entries of model `name`, and those READY (of version `wanted`, if
        given)."""
        found = [m for m in await self._index(fresh) if m.get("name") == name]
        ready = [
            m
            for m in found
            if m.get("state") == "READY"
            and m.get("version")
            and (not wanted or str(m["version"]) == wanted)
        ]
        return found, ready

    async def _describe(self, name: str, version: str) -> Model | None:
        if (name, version) in self.known:
            return self.known[(name, version)]
        try:
            cfg = (await self.client.get_model_config(name, version, as_json=True))["config"]
        except Exception:  # noqa: BLE001 - unloaded meanwhile: not listed
            return None
        outputs = tuple(t["name"] for t in cfg.get("output", []))
        kind = kind_of(cfg)
        if kind is None:
            return None
        labels = cfg.get("parameters", {}).get("labels", {}).get("string_value")
        dims: list[Any] = next(
            (t.get("dims", []) for t in cfg.get("output", []) if t["name"] == "EMBEDDING"), []
        )
        width = int(dims[-1]) if dims and int(dims[-1]) > 0 else None
        model = Model(
            name=name,
            version=version,
            kind=kind,
            max_batch_size=int(cfg.get("max_batch_size", 0) or 0),
            outputs=outputs,
            created=int(time.time()),
            labels=tuple(json.loads(labels or "[]")),
            width=width,
            chat_tools=cfg.get("parameters", {}).get("chat_tools", {}).get("string_value", ""),
            logit_scale=float(
                cfg.get("parameters", {}).get("logit_scale", {}).get("string_value") or 0.0
            ),
        )
        self.known[(name, version)] = model
        return model

    def _inputs(self, arrays: dict[str, np.ndarray]) -> list[Any]:
        found = []
        for name, arr in arrays.items():
            x = self.grpc.InferInput(name, list(arr.shape), DTYPES[arr.dtype])
            x.set_data_from_numpy(arr)
            found.append(x)
        return found

    async def infer(
        self, model: Model, arrays: dict[str, np.ndarray], prompt_param: str = "input"
    ) -> dict[str, np.ndarray]:
        """One request to a model that answers once."""
        try:
            result = await self.client.infer(
                model.name, self._inputs(arrays), model_version=model.asked_version
            )
        except Exception as exc:  # noqa: BLE001 - classified by status
            raise refusal(exc, prompt_param) from None
        return {name: result.as_numpy(name) for name in model.outputs}

    async def stream(
        self, model: Model, arrays: dict[str, np.ndarray], prompt_param: str = "prompt"
    ) -> AsyncIterator[dict[str, Any]]:
        """Every response of one request to a decoupled model: its outputs, `final`."""

        async def requests():
            yield {
                "model_name": model.name,
                "model_version": model.asked_version,
                "inputs": self._inputs(arrays),
                "enable_empty_final_response": True,
            }

        responses = self.client.stream_infer(requests())
        try:
            async for result, error in responses:
                if error is not None:
                    raise refusal(error, prompt_param)
                out = {name: result.as_numpy(name) for name in model.outputs}
                params = result.get_response().parameters
                out["final"] = params["triton_final_response"].bool_param
                yield out
                if out["final"]:
                    return
        finally:
            responses.cancel()  # a client that left: Triton cancels the request


def refusal(exc: BaseException, prompt_param: str) -> ApiError:
    """A Triton failure as the API's error: the request's fault (400, naming the field), or
    the server's state (503: not ready, queue full, unreachable). A decoupled model's refusal
    comes in its stream without a status: it is the request's when it names a field."""
    status = str(getattr(exc, "status", lambda: "")() or "")
    message = exc.message() if hasattr(exc, "message") else str(exc)
    message = " ".join(str(message).split())
    param = param_of(message, prompt_param)
    if status in ("StatusCode.INVALID_ARGUMENT", "400") or (not status and param):
        return bad_request(message, param)
    if status in ("StatusCode.UNAVAILABLE", "StatusCode.RESOURCE_EXHAUSTED", "503"):
        return unavailable(f"Triton cannot take the request now: {message}")
    if status in ("StatusCode.NOT_FOUND", "404"):
        return ApiError(404, message, param="model", code="model_not_found")
    return ApiError(502, f"Triton failed the request: {message}", type="server_error")
