"""The smoke test of a deployed version, for every kind: the items the gate chose are sent over
gRPC and HTTP one request at a time, over gRPC as the dynamic batches the gate measured, and
through the OpenAI-compatible API beside Triton (where the kind has a route there); the
served answers are scored against the original PyTorch model's with the gate's own metrics and
limits (`reference.json` of the validate step). A miss, or a request the server refuses, fails
the release and the champion does not move.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, NotRequired, TypedDict

import numpy as np

from hf2triton.clients.openai import OpenAIInference
from hf2triton.clients.triton import inference
from hf2triton.errors import SmokeTestError
from hf2triton.kinds.base import Data, ModelKind, describe_misses, misses, worst_of


class Endpoint(TypedDict):
    name: str  # what to call it in a message: "local", a replica's address, a container
    http: str  # host:port
    grpc: str  # host:port
    version: str  # the version to query ("" for the one the server serves)
    openai: NotRequired[str]  # the OpenAI-compatible API's base URL beside it, if it runs one


def batches(requests: list[dict[str, np.ndarray]], size: int) -> list[dict[str, np.ndarray]]:
    """Consecutive requests merged into requests of up to `size` rows (requests whose inputs
    have other shapes start a new one)."""
    merged: list[list[dict[str, np.ndarray]]] = []
    for request in requests:
        shapes = {k: v.shape[1:] for k, v in request.items()}
        last = merged[-1] if merged else None
        if last and len(last) < size and {k: v.shape[1:] for k, v in last[0].items()} == shapes:
            last.append(request)
        else:
            merged.append([request])
    return [{k: np.concatenate([r[k] for r in group]) for k in group[0]} for group in merged]


def split(answer: dict[str, np.ndarray], rows: list[int]) -> list[dict[str, np.ndarray]]:
    """A merged request's answer back into one answer per original request."""
    out, start = [], 0
    for n in rows:
        out.append({k: v[start : start + n] for k, v in answer.items()})
        start += n
    return out


def session_for(
    kind: ModelKind,
    cfg: Any,
    endpoint: Endpoint,
    model: str,
    way: str,
    protocol: str,
    api_key: str | None,
) -> Any:
    """A session that asks one way: Triton over gRPC or HTTP, or the OpenAI-compatible API
    beside it (the kind's requests on the kind's route)."""
    what = f"answer a smoke request ({way}, {endpoint['name']})"
    if protocol == "openai":
        return contextlib.closing(
            OpenAIInference(
                endpoint["openai"],
                model,
                endpoint["version"],
                kind,
                cfg,
                SmokeTestError,
                what,
                api_key=api_key,
            )
        )
    return inference(
        protocol, endpoint[protocol], model, endpoint["version"], kind.outputs, SmokeTestError, what
    )


def smoke_endpoint(
    kind: ModelKind,
    endpoint: Endpoint,
    model: str,
    reference: dict[str, Any],
    api_key: str | None = None,
) -> dict[str, float]:
    """Figures of one endpoint: `<way>_<metric>` for each way of asking (gRPC, HTTP, batches
    over gRPC, and the OpenAI-compatible API where the endpoint has one and the kind a route
    there), and latencies."""
    cfg = kind.config_from_dict(reference["config"])
    data = Data(reference["items"])
    expected = kind.from_json(reference["reference"])
    limits = reference["limits"]
    requests = kind.requests(data.items)
    figures: dict[str, float] = {"items": float(len(requests))}
    scored: list[dict[str, float]] = []
    ways = [("grpc", "grpc", 1), ("http", "http", 1), ("batch", "grpc", reference["batch"])]
    if endpoint.get("openai") and kind.openai_route:
        ways.append(("openai", "openai", 1))
    for name, protocol, size in ways:
        with session_for(kind, cfg, endpoint, model, name, protocol, api_key) as session:
            session.wait_ready()
            answers = []
            for merged in batches(requests, size):
                rows = len(next(iter(merged.values())))
                answers.extend(
                    split(session(merged), [1] * rows) if size > 1 else [session(merged)]
                )
            latency = session.latencies_ms
        metrics, details = kind.score(expected, kind.extract(answers), data, cfg)
        missed = misses(metrics, limits)
        if missed:
            example = kind.example(details)
            raise SmokeTestError(
                f"{model} version {endpoint['version']} on {endpoint['name']} ({name}) serves "
                f"answers that differ from PyTorch beyond the gate: "
                f"{describe_misses(metrics, limits, missed)}"
                + (f"; {example}" if example else "")
                + "; champion was not moved"
            )
        scored.append(metrics)
        figures.update({f"{name}_{k}": v for k, v in metrics.items()})
        if size == 1:
            figures[f"{name}_p50_ms"] = float(np.median(latency))
    figures.update({k: v for k, v in worst_of(scored, limits).items()})
    return figures


def smoke_test(
    kind: ModelKind,
    endpoints: list[Endpoint],
    model: str,
    reference_path: str,
    api_key: str | None = None,
) -> dict[str, float]:
    """The smoke test on every endpoint; the worst figures over them."""
    with open(reference_path, encoding="utf-8") as f:
        reference = json.load(f)
    results = [smoke_endpoint(kind, e, model, reference, api_key) for e in endpoints]
    worst: dict[str, float] = {}
    for key in results[0]:
        values = [r[key] for r in results if key in r]
        worst[key] = (
            max(values)
            if key.endswith("_ms")
            or reference["limits"].get(key.split("_", 1)[-1], (">=",))[0] == "<="
            else min(values)
        )
    return worst
