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
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np

from hf2triton.clients.openai import OpenAIApi, OpenAIInference
from hf2triton.clients.triton import Failure, inference
from hf2triton.errors import SmokeTestError
from hf2triton.kinds.base import Data, ModelKind, describe_misses, misses, worst_of
from hf2triton.kinds.config import KindConfig

# How the smoke test asks an endpoint: Triton's gRPC or HTTP, or the OpenAI-compatible API.
Protocol = Literal["grpc", "http", "openai"]


@dataclass(frozen=True)
class Way:
    """One way of asking an endpoint: its name in the figures, the protocol, and how many
    requests go as one."""

    name: str
    protocol: Protocol
    size: int = 1


class Endpoint(TypedDict):
    name: str  # what to call it in a message: "local", a replica's address, a container
    http: str  # host:port
    grpc: str  # host:port
    version: str  # the version to query ("" for the one the server serves)
    openai: NotRequired[str]  # the OpenAI-compatible API's base URL beside it, if it runs one


def groups(requests: list[dict[str, np.ndarray]], size: int) -> list[list[int]]:
    """Which consecutive requests merge into one request of up to `size` rows (requests whose
    inputs have other shapes start a new one): the smoke test's batches, and the gate's record
    of them."""
    merged: list[list[int]] = []
    for i, request in enumerate(requests):
        shapes = {k: v.shape[1:] for k, v in request.items()}
        last = merged[-1] if merged else None
        if (
            last
            and len(last) < size
            and {k: v.shape[1:] for k, v in requests[last[0]].items()} == shapes
        ):
            last.append(i)
        else:
            merged.append([i])
    return merged


def batches(requests: list[dict[str, np.ndarray]], size: int) -> list[dict[str, np.ndarray]]:
    """The requests of each of `groups` merged into one."""
    return [
        {k: np.concatenate([requests[i][k] for i in group]) for k in requests[group[0]]}
        for group in groups(requests, size)
    ]


def split(answer: dict[str, np.ndarray], rows: list[int]) -> list[dict[str, np.ndarray]]:
    """A merged request's answer back into one answer per original request."""
    out, start = [], 0
    for n in rows:
        out.append({k: v[start : start + n] for k, v in answer.items()})
        start += n
    return out


def session_for(
    kind: ModelKind, cfg: KindConfig, endpoint: Endpoint, model: str, way: Way, api_key: str | None
) -> Any:
    """A session that asks one way: Triton over gRPC or HTTP, or the OpenAI-compatible API
    beside it (the kind's requests on the kind's route)."""
    failure = Failure(SmokeTestError, f"answer a smoke request ({way.name}, {endpoint['name']})")
    if way.protocol == "openai":
        api = OpenAIApi(endpoint["openai"], api_key)
        return contextlib.closing(
            OpenAIInference(api, model, endpoint["version"], kind, cfg, failure)
        )
    return inference(
        way.protocol, endpoint[way.protocol], model, endpoint["version"], kind.outputs, failure
    )


def expected_answers(kind: ModelKind, reference: dict[str, Any], size: int) -> Any:
    """What the endpoint must answer to the smoke requests sent `size` at a time: the shipped
    candidate's own answers the gate recorded as the smoke test sends them (a reference.json of
    a release before they were recorded: PyTorch's)."""
    recorded = reference.get("recorded")
    if not recorded:
        return kind.from_json(reference["reference"])
    return kind.from_json(recorded[str(size)] if str(size) in recorded else recorded["1"])


def differs(
    kind: ModelKind,
    reference: dict[str, Any],
    where: str,
    metrics: dict[str, float],
    details: dict[str, Any],
) -> SmokeTestError:
    """The smoke failure of one way of asking (`where`: the version, the endpoint and the way):
    which input differed and how, from what, and what to do."""
    limits, judged = reference["limits"], reference.get("candidate")
    missed = misses(metrics, limits)
    against = "the judged answer" if judged else "PyTorch"
    example = kind.example(details, against=against)
    what = (
        f"does not serve what the gate judged ({judged})"
        if judged
        else "serves answers that differ from PyTorch beyond the gate"
    )
    return SmokeTestError(
        f"{where} {what}: "
        f"{describe_misses(metrics, limits, missed)}"
        + (f"; {example}" if example else "")
        + "; champion was not moved"
        + (f". {reference['next']}" if reference.get("next") else "")
    )


def ask(session: Any, requests: list[dict[str, np.ndarray]], size: int) -> list[Any]:
    """The session's answer to each request, the requests sent `size` at a time."""
    answers: list[dict[str, np.ndarray]] = []
    for merged in batches(requests, size):
        rows = len(next(iter(merged.values())))
        answers.extend(split(session(merged), [1] * rows) if size > 1 else [session(merged)])
    return answers


def smoke_endpoint(
    kind: ModelKind,
    endpoint: Endpoint,
    model: str,
    reference: dict[str, Any],
    api_key: str | None = None,
) -> dict[str, float]:
    """Figures of one endpoint: `<way>_<metric>` for each way of asking (gRPC, HTTP, batches
    over gRPC, and the OpenAI-compatible API where the endpoint has one and the kind a route
    there), each scored against what the gate recorded the shipped candidate answering the same
    requests asked the same way, and latencies."""
    cfg = kind.config_from_dict(reference["config"])
    data = Data(reference["items"])
    limits = reference["limits"]
    requests = kind.requests(data.items)
    figures: dict[str, float] = {"items": float(len(requests))}
    scored: list[dict[str, float]] = []
    ways = [Way("grpc", "grpc"), Way("http", "http"), Way("batch", "grpc", reference["batch"])]
    if endpoint.get("openai") and kind.openai_route:
        ways.append(Way("openai", "openai"))
    for way in ways:
        with session_for(kind, cfg, endpoint, model, way, api_key) as session:
            session.wait_ready()
            answers = ask(session, requests, way.size)
            latency = session.latencies_ms
        expected = expected_answers(kind, reference, way.size)
        metrics, details = kind.score(expected, kind.extract(answers), data, cfg)
        if misses(metrics, limits):
            where = f"{model} version {endpoint['version']} on {endpoint['name']} ({way.name})"
            raise differs(kind, reference, where, metrics, details)
        scored.append(metrics)
        figures.update({f"{way.name}_{k}": v for k, v in metrics.items()})
        if way.size == 1:
            figures[f"{way.name}_p50_ms"] = float(np.median(latency))
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
