"""The API's routes over one Triton server (triton.py), with OpenAI's error object for every
failure, optional bearer keys (kept as sha256 hashes, compared in constant time, never logged),
limits on a request's size and time, and Prometheus metrics of its own by route and model."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import ApiError, bad_request, not_found
from .schemas import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Generation,
    PredictRequest,
    RerankRequest,
)
from .triton import Model, Triton

PUBLIC = ("/health", "/metrics")  # no key asked
DRAIN_LIMIT = 64 << 20  # a body over the limit but under this is read (and dropped) first


class Json(Response):
    """JSON with numpy arrays written directly (orjson), NaN refused upstream."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        import orjson

        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


class Limits:
    """ASGI middleware: a body over `max_body` bytes is refused (413) before it is read whole,
    a request without a valid key (when keys are set) is refused (401), and every request is
    counted and timed by route and model."""

    def __init__(self, app: Any, max_body: int, key_hashes: tuple[str, ...], metrics: Any):
        self.app, self.max_body, self.key_hashes, self.metrics = app, max_body, key_hashes, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        headers = dict(scope.get("headers") or [])
        if self.key_hashes and not path.startswith(PUBLIC) and not self._allowed(headers):
            return await self._refuse(
                send,
                ApiError(
                    401,
                    "Incorrect or missing API key: send it as 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                ),
            )
        size = int(headers.get(b"content-length", b"0") or 0)
        if size > self.max_body:
            if size <= DRAIN_LIMIT:  # read and dropped: a client still sending sees the 413
                while (await receive()).get("more_body"):
                    pass
            return await self._refuse(
                send,
                ApiError(
                    413,
                    f"The request is {size} bytes, over this API's limit of {self.max_body}: "
                    "send fewer or shorter inputs per request",
                    code="request_too_large",
                ),
            )
        seen = [0]

        async def bounded() -> dict:
            message = await receive()
            seen[0] += len(message.get("body", b""))
            if seen[0] > self.max_body:
                raise ApiError(
                    413,
                    f"The request is over this API's limit of {self.max_body} bytes",
                    code="request_too_large",
                )
            return message

        status = [500]

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        started = time.perf_counter()
        scope.setdefault("state", {})
        try:
            await self.app(scope, bounded, sending)
        finally:
            if not path.startswith(PUBLIC):
                model = scope["state"].get("model", "")
                self.metrics.observe(path, model, status[0], time.perf_counter() - started)

    def _allowed(self, headers: dict[bytes, bytes]) -> bool:
        given = headers.get(b"authorization", b"").decode("latin-1")
        if not given.lower().startswith("bearer "):
            return False
        digest = hashlib.sha256(given[7:].strip().encode()).hexdigest()
        ok = False
        for h in self.key_hashes:  # every one compared, in constant time each
            ok |= hmac.compare_digest(digest, h)
        return ok

    @staticmethod
    async def _refuse(send: Any, error: ApiError) -> None:
        body = json.dumps(error.body()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": error.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class Metrics:
    """Requests, errors and latency by route and model, on /metrics (Prometheus)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hf2triton_openai_requests",
            "Requests answered",
            ["route", "model", "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "hf2triton_openai_errors",
            "Requests answered with an error",
            ["route", "model", "status"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "hf2triton_openai_request_seconds",
            "Time to answer a request (a stream: to its end)",
            ["route", "model"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )

    def observe(self, route: str, model: str, status: int, seconds: float) -> None:
        self.requests.labels(route, model, str(status)).inc()
        if status >= 400:
            self.errors.labels(route, model, str(status)).inc()
        self.seconds.labels(route, model).observe(seconds)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def create_app(
    triton_url: str,
    key_hashes: tuple[str, ...] = (),
    max_body: int = 4 << 20,
    timeout_s: float = 600.0,
) -> Any:
    """The API over the Triton gRPC endpoint `triton_url` (host:port)."""
    metrics = Metrics()
    server: dict[str, Triton] = {}

    def triton() -> Triton:
        if "t" not in server:  # made in the serving loop, where its channel lives
            server["t"] = Triton(triton_url)
        return server["t"]

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if "t" in server:
            await server.pop("t").close()

    app = FastAPI(
        title="hf2triton OpenAI-compatible API",
        docs_url=None,
        redoc_url=None,
        openapi_url="/v1/openapi.json",
        lifespan=lifespan,
    )

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body",)]
        param = loc[0] if loc else None
        message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        if first.get("type") == "json_invalid":
            message, param = "The body is not valid JSON", None
        shown = ".".join(loc) or "request"
        return JSONResponse(bad_request(f"{shown}: {message}", param).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return JSONResponse(
            ApiError(exc.status_code, str(exc.detail), code=code).body(),
            status_code=exc.status_code,
        )

    async def timed(coro: Any) -> Any:
        try:
            return await asyncio.wait_for(coro, timeout_s)
        except TimeoutError:
            raise ApiError(
                504, f"The request took over {timeout_s:.0f} s", type="timeout", code="timeout"
            ) from None

    @app.get("/health")
    async def health() -> dict[str, Any]:
        live = await triton().live()
        if not live:
            raise ApiError(
                503, f"Triton at {triton_url} does not answer", type="service_unavailable"
            )
        return {"status": "ok", "triton": triton_url}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> Json:
        return Json({"object": "list", "data": [describe(m) for m in await triton().models()]})

    @app.get("/v1/models/{name}")
    async def one_model(name: str) -> Json:
        for m in await triton().models():
            if m.name == name:
                return Json(describe(m))
        raise not_found(name)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, request: Request) -> Json:
        request.state.model = body.model
        model = await triton().model(body.model, ("embedding",), "/v1/embeddings")
        # A size the model does not make is refused before any inference is run.
        if body.dimensions is not None and model.width and body.dimensions != model.width:
            raise bad_request(
                f"dimensions {body.dimensions}: this model's embeddings have {model.width}",
                param="dimensions",
            )
        texts = [body.input] if isinstance(body.input, str) else body.input
        chunk = model.max_batch_size or len(texts)
        parts = await timed(
            asyncio.gather(
                *(
                    triton().infer(
                        model,
                        {
                            "TEXT": np.array(
                                [[t.encode("utf-8")] for t in texts[i : i + chunk]],
                                dtype=np.object_,
                            )
                        },
                    )
                    for i in range(0, len(texts), chunk)
                )
            )
        )
        vectors = np.concatenate([p["EMBEDDING"] for p in parts]).astype(np.float32)
        if body.dimensions is not None and body.dimensions != vectors.shape[1]:
            raise bad_request(
                f"dimensions {body.dimensions}: this model's embeddings have {vectors.shape[1]}",
                param="dimensions",
            )
        tokens = int(sum(int(p["TOKENS"].sum()) for p in parts if p.get("TOKENS") is not None))
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
                if body.encoding_format == "base64"
                else v,
            }
            for i, v in enumerate(vectors)
        ]
        return Json(
            {
                "object": "list",
                "data": data,
                "model": model.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Response:
        request.state.model = body.model
        model = await triton().model(body.model, ("text_generation",), "/v1/chat/completions")
        try:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        except ValueError as exc:
            raise bad_request(str(exc), param="messages") from None
        arrays = {
            "messages": text_array(json.dumps(messages, ensure_ascii=False)),
            **sampling(body),
        }
        return await generate(model, body, arrays, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        request.state.model = body.model
        model = await triton().model(body.model, ("text_generation",), "/v1/completions")
        arrays = {"text_input": text_array(str(body.prompt)), **sampling(body)}
        return await generate(model, body, arrays, chat=False)

    async def generate(
        model: Model, body: Generation, arrays: dict[str, np.ndarray], chat: bool
    ) -> Response:
        prompt_param = "messages" if chat else "prompt"
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        arrays["stream"] = np.array([[bool(body.stream)]], dtype=bool)
        if body.prompt_logprob:
            if body.stream:
                raise bad_request(
                    "prompt_logprob is answered without stream only", param="prompt_logprob"
                )
            arrays["return_prompt_logprob"] = np.array([[True]], dtype=bool)
        responses = triton().stream(model, arrays, prompt_param)
        # The first answer before anything is sent: a refused request is a plain 400.
        first = await timed(responses.__anext__())
        if not body.stream:
            answer = first
            while not answer["final"]:
                answer = await timed(responses.__anext__())
            text = first_text(answer)
            reason = finish(answer)
            ids = [int(i) for i in answer["output_ids"].reshape(-1) if i >= 0]
            usage = usage_of(answer, len(ids))
            choice = {
                "index": 0,
                "finish_reason": reason,
                "logprobs": None,
                **({"message": {"role": "assistant", "content": text}} if chat else {"text": text}),
            }
            if body.return_token_ids:
                choice["token_ids"] = ids
            if body.prompt_logprob:
                choice["prompt_logprob"] = float(answer["prompt_logprob"].reshape(-1)[0])
            return Json(
                {
                    "id": ident,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": created,
                    "model": model.name,
                    "choices": [choice],
                    "usage": usage,
                }
            )
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            events(
                ident,
                created,
                model,
                chat,
                first,
                responses,
                include_usage,
                bool(body.return_token_ids),
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    async def events(
        ident: str,
        created: int,
        model: Model,
        chat: bool,
        first: dict,
        responses: AsyncIterator[dict],
        include_usage: bool,
        token_ids: bool,
    ) -> AsyncIterator[bytes]:
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list, usage: dict | None = None) -> bytes:
            body: dict[str, Any] = {
                "id": ident,
                "object": obj,
                "created": created,
                "model": model.name,
                "choices": choices,
            }
            if include_usage:
                body["usage"] = usage
            return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"

        def piece(text: str, reason: str | None, ids: list[int]) -> dict:
            out = (
                {"index": 0, "delta": {"content": text} if text else {}}
                if chat
                else {"index": 0, "text": text}
            )
            out.update({"finish_reason": reason, "logprobs": None})
            if token_ids:
                out["token_ids"] = ids
            return out

        if chat:  # the role first, as OpenAI's streams start
            yield chunk(
                [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                        "logprobs": None,
                    }
                ]
            )
        generated = 0
        answer = first
        try:
            while True:
                text = first_text(answer)
                found = answer.get("output_ids")
                ids = [int(i) for i in found.reshape(-1) if i >= 0] if found is not None else []
                generated += len(ids)
                reason = finish(answer) if answer["final"] else None
                if text or reason:
                    yield chunk([piece(text, reason, ids)])
                if answer["final"]:
                    break
                answer = await responses.__anext__()
            if include_usage:
                yield chunk([], usage_of(answer, generated))
        except ApiError as exc:
            yield b"data: " + json.dumps(exc.body()).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    @app.post("/v1/rerank")
    @app.post("/rerank")
    async def rerank(request: Request) -> Json:
        raw = await read_json(request)
        tei = "texts" in raw and "documents" not in raw  # text-embeddings-inference's shape
        if tei:
            raw = {
                **raw,
                "documents": raw.pop("texts"),
                "return_documents": raw.pop("return_text", False),
            }
        if not raw.get("model"):  # text-embeddings-inference's requests name none
            raw["model"] = await only_model("reranking")
        body = parse(RerankRequest, raw)
        model_name = body.model
        request.state.model = model_name
        model = await triton().model(model_name, ("reranking",), "/v1/rerank")
        try:
            docs = body.texts()
        except ValueError as exc:
            raise bad_request(str(exc), param="documents") from None
        out = await timed(
            triton().infer(
                model,
                {
                    "QUERY": text_array(body.query),
                    "PASSAGES": np.array([[d.encode("utf-8") for d in docs]], dtype=np.object_),
                },
                prompt_param="query",
            )
        )
        scores = out["SCORES"][0]
        order = np.argsort(-scores, kind="stable")[: body.top_n or len(docs)]
        if tei:
            return Json(
                [
                    {
                        "index": int(i),
                        "score": float(scores[i]),
                        **({"text": docs[i]} if body.return_documents else {}),
                    }
                    for i in order
                ]
            )
        results = [
            {
                "index": int(i),
                "relevance_score": float(scores[i]),
                **({"document": {"text": docs[i]}} if body.return_documents else {}),
            }
            for i in order
        ]
        return Json({"id": f"rerank-{uuid.uuid4().hex}", "model": model.name, "results": results})

    @app.post("/predict")
    @app.post("/v1/predict")
    async def predict(request: Request) -> Json:
        body = parse(PredictRequest, await read_json(request))
        model_name = body.model or await only_model("classification")
        request.state.model = model_name
        model = await triton().model(model_name, ("classification",), "/predict")
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        if not texts:
            raise bad_request("inputs is empty: send at least one text", param="inputs")
        out = await timed(
            triton().infer(
                model, {"TEXT": np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)}
            )
        )
        scores = out["SCORES"]
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

    async def only_model(kind: str) -> str:
        """The one model of `kind` served (TEI's requests name none)."""
        found = [m.name for m in await triton().models() if m.kind == kind]
        if len(found) != 1:
            raise bad_request(
                f"name the model: {len(found)} {kind} models are served", param="model"
            )
        return found[0]

    app.add_middleware(Limits, max_body=max_body, key_hashes=tuple(key_hashes), metrics=metrics)
    return app


async def read_json(request: Request) -> dict[str, Any]:
    try:
        raw = json.loads(await request.body())
    except ValueError:
        raise bad_request("The body is not valid JSON") from None
    if not isinstance(raw, dict):
        raise bad_request("The body must be a JSON object")
    return raw


def parse(schema: type, raw: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first.get("loc", ())]
        raise bad_request(
            f"{'.'.join(loc) or 'request'}: {str(first.get('msg')).removeprefix('Value error, ')}",
            param=loc[0] if loc else None,
        ) from None


def describe(m: Model) -> dict[str, Any]:
    return {
        "id": m.name,
        "object": "model",
        "created": m.created,
        "owned_by": "hf2triton",
        "version": m.version,
        "kind": m.kind,
    }


def text_array(text: str) -> np.ndarray:
    return np.array([[text.encode("utf-8")]], dtype=np.object_)


def sampling(body: Generation) -> dict[str, np.ndarray]:
    """The served model's optional inputs for what the request sets (the rest: its defaults)."""
    arrays: dict[str, np.ndarray] = {}
    if body.tokens is not None:
        arrays["max_tokens"] = np.array([[body.tokens]], np.int32)
    for name in ("temperature", "top_p", "repetition_penalty"):
        value = getattr(body, name)
        if value is not None:
            arrays[name] = np.array([[value]], np.float32)
    if body.top_k is not None:
        arrays["top_k"] = np.array([[body.top_k]], np.int32)
    if body.seed is not None:
        arrays["seed"] = np.array([[body.seed]], np.uint64)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if stops:
        arrays["stop_words"] = np.array([[s.encode("utf-8") for s in stops]], dtype=np.object_)
    return arrays


def first_text(answer: dict[str, Any]) -> str:
    text = answer.get("text_output")
    if text is None or not text.size:
        return ""
    raw = text.reshape(-1)[0]
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


def finish(answer: dict[str, Any]) -> str:
    reason = answer.get("finish_reason")
    if reason is None or not reason.size:
        return "stop"
    value = reason.reshape(-1)[0]
    value = value.decode() if isinstance(value, bytes) else str(value)
    return {"cancelled": "stop"}.get(value, value)


def usage_of(answer: dict[str, Any], generated: int) -> dict[str, int]:
    prompt = answer.get("prompt_tokens")
    prompt_tokens = int(prompt.reshape(-1)[0]) if prompt is not None and prompt.size else 0
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": prompt_tokens + generated,
    }
