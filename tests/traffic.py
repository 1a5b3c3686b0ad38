"""Closed-loop live traffic over every protocol a release serves, as its users send it: Triton's
HTTP and gRPC clients (tritonclient) and the OpenAI-compatible API (httpx), short queries mixed
with long passages, each client on a connection it keeps. Every request is logged with its
start, end, protocol, the version that answered (Triton's protocols say it) or its error; the
summary counts failed requests and the longest stretch with no answer, which the reliability
table reports per target."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from tests.served import LONG, SHORT, ClientThreads

PROTOCOLS = ("http", "grpc", "openai")


@dataclass
class Answer:
    start: float
    end: float
    protocol: str
    version: str | None
    error: str | None


@dataclass
class MixedTraffic(ClientThreads):
    """`clients` threads, protocol by turn, sending to `urls` (http and grpc: host:port; openai:
    the API's base URL, .../v1) for an embedding model `model`, each `pause_s` apart."""

    urls: dict[str, str]
    model: str
    clients: int = 16
    pause_s: float = 0.0
    log: list[Answer] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        protocols = [p for p in PROTOCOLS if p in self.urls]
        turns = itertools.islice(itertools.cycle(protocols), self.clients)
        self._threads = [
            threading.Thread(target=self._run, args=(p, i), daemon=True)
            for i, p in enumerate(turns)
        ]

    def _send(self, protocol: str):
        """A client of `protocol` on one kept connection: a function text -> version."""
        if protocol == "openai":
            import httpx

            http = httpx.Client(base_url=self.urls["openai"], timeout=60.0)

            def openai(text: str) -> str | None:
                r = http.post("/embeddings", json={"model": self.model, "input": text})
                r.raise_for_status()
                assert len(r.json()["data"][0]["embedding"]) > 0
                return None

            return openai, http.close
        if protocol == "grpc":
            import tritonclient.grpc as module
        else:
            import tritonclient.http as module  # type: ignore[no-redef]
        client = module.InferenceServerClient(url=self.urls[protocol])

        def triton(text: str) -> str | None:
            x = module.InferInput("TEXT", [1, 1], "BYTES")
            x.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
            res = client.infer(self.model, [x])
            assert res.as_numpy("EMBEDDING").shape[0] == 1
            if protocol == "grpc":
                return str(res.get_response().model_version)
            return str(res.get_response()["model_version"])

        return triton, client.close

    def _run(self, protocol: str, index: int) -> None:
        send, close = self._send(protocol)
        n = index
        while not self._stop.is_set():
            n += 1
            started = time.time()
            try:
                version, error = send(LONG if n % 2 else SHORT), None
            except Exception as exc:  # noqa: BLE001 - a failed request is what is counted
                version, error = None, f"{type(exc).__name__}: {exc}"[:300]
            self.log.append(Answer(started, time.time(), protocol, version, error))
            if error is not None:
                close()  # as a user's client would: a new connection after an error
                send, close = self._send(protocol)
            if self.pause_s:
                time.sleep(self.pause_s)
        close()

    def between(self, since: float, until: float) -> list[Answer]:
        return [a for a in self.log if since <= a.start <= until]

    def summary(self, since: float = 0.0, until: float = float("inf")) -> dict:
        """Requests, failed ones (with a few errors), latency p50/p99/max (ms) and the longest
        stretch with no answer (s) among requests started in [since, until]."""
        answers = sorted(self.between(since, until), key=lambda a: a.end)
        ok = [a for a in answers if a.error is None]
        ms = np.array([(a.end - a.start) * 1000 for a in ok]) if ok else np.zeros(1)
        ends = [a.end for a in ok]
        quiet = max((b - a for a, b in itertools.pairwise(ends)), default=0.0)
        return {
            "requests": len(answers),
            "failed": len(answers) - len(ok),
            "by_protocol": {
                p: sum(a.protocol == p for a in answers) for p in PROTOCOLS if p in self.urls
            },
            "errors": sorted({a.error for a in answers if a.error})[:5],
            "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1),
            "max_ms": round(float(ms.max()), 1),
            "longest_no_answer_s": round(quiet, 3),
            "versions": sorted({a.version for a in ok if a.version}),
        }


def in_flight(log: list[Answer], at: float) -> list[Answer]:
    """The requests of `log` sent before `at` and not answered (or failed) by then."""
    return [a for a in log if a.start <= at < a.end]


@dataclass
class SpreadTraffic:
    """`clients` spread over several servers, each entry of `servers` a MixedTraffic's `urls`
    (a client keeps to its server, as with replicas that have no front): `parts[i]` is server
    i's traffic, `summary` all of it."""

    servers: list[dict[str, str]]
    model: str
    clients: int = 16

    def __post_init__(self) -> None:
        share, extra = divmod(self.clients, len(self.servers))
        self.parts = [
            MixedTraffic(urls, self.model, clients=share + (i < extra))
            for i, urls in enumerate(self.servers)
        ]

    @property
    def log(self) -> list[Answer]:
        return [a for part in self.parts for a in part.log]

    def __enter__(self) -> SpreadTraffic:
        for part in self.parts:
            part.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for part in self.parts:
            part._stop.set()  # all stop at once, then each is joined
        for part in self.parts:
            part.__exit__(*exc)

    def summary(self, since: float = 0.0, until: float = float("inf")) -> dict:
        protocols = {p: "" for part in self.parts for p in part.urls}
        return MixedTraffic(protocols, self.model, clients=0, log=self.log).summary(since, until)


def release_then_rollback(traffic, spec) -> tuple[str, dict, dict[str, tuple[float, float]], float]:
    """Under `traffic` (already sending): a release of `spec`, then `hf2triton rollback`'s path.
    Returns the new version, the rollback's answer, each switch's (start, end) and when the
    rollback returned."""
    from hf2triton.flows.release import release_model
    from hf2triton.watch.rollback import roll_back

    started = time.time()
    new = release_model(spec)["mlflow"]["version"]
    released = time.time()
    back = roll_back(spec, "switch under traffic (test)")
    done = time.time()
    switches = {
        f"release 1 -> {new}": (started, released),
        f"rollback {new} -> 1": (released, done),
    }
    return new, back, switches, done
