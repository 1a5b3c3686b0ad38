"""What a test asks a served model, the way a user's client would (tritonclient over gRPC or
HTTP), and small readers shared by the test modules."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from hf2triton.kinds.base import read_lines
from hf2triton.util.waiting import wait_until


def read_sentences(path: str | Path) -> list[str]:
    return read_lines(path, "validation.sentences")


def triton_client(url: str):
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url=url, network_timeout=600.0)


def serving_versions(client, model: str) -> list[str]:
    """Versions of `model` a server's repository index lists READY."""
    return sorted(
        (
            str(m["version"])
            for m in client.get_model_repository_index()
            if m.get("name") == model and m.get("state") == "READY" and m.get("version")
        ),
        key=int,
    )


def embed_remote(
    protocol: str, url: str, model: str, version: str, texts: list[str], timeout_s: float = 60
) -> tuple[np.ndarray, list[float]]:
    """Embed each text as its own request; embeddings and per-request latency (ms)."""
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    client = module.InferenceServerClient(url=url)
    assert wait_until(lambda: client.is_model_ready(model, version), timeout_s), (
        f"{model} {version} not ready on {url}"
    )
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


SHORT, LONG = "thanks a lot", "a fairly long sentence about prices and markets " * 5


class ClientThreads:
    """Client threads started on entering and stopped (then joined) on leaving: a subclass
    sets `_threads` and loops in them until `_stop` is set."""

    _stop: threading.Event
    _threads: list[threading.Thread]

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


class Traffic(ClientThreads):
    """Clients sending short and long texts to each of `urls` (Triton HTTP, host:port) without
    naming a version, one thread per URL: every request's outcome is noted with its time, the
    URL and the version that answered, or the error."""

    def __init__(self, urls: str | list[str], model: str):
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        self.model = model
        self.log: list[tuple[float, str, str | None, str | None]] = []  # at, url, version, error
        # The same outcomes with when each request was sent (`log`'s time is when it ended).
        self.sent: list[tuple[float, str, str | None, str | None]] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(u,), daemon=True) for u in self.urls
        ]

    @property
    def answered(self) -> list[str]:
        return [v for _, _, v, e in self.log if e is None]

    @property
    def failed(self) -> list[str]:
        return [e for _, _, _, e in self.log if e is not None]

    def failed_at(self, url: str) -> list[str]:
        return [e for _, u, _, e in self.log if e is not None and u == url]

    def _run(self, url: str) -> None:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(
            url=url, connection_timeout=5.0, network_timeout=30.0
        )
        n = 0
        while not self._stop.is_set():
            text = LONG if n % 2 else SHORT
            n += 1
            x = httpclient.InferInput("TEXT", [1, 1], "BYTES")
            x.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
            sent = time.time()
            try:
                res = client.infer(self.model, [x])
                outcome = (url, str(res.get_response()["model_version"]), None)
            except Exception as exc:  # noqa: BLE001 - a failed request is what is counted
                outcome = (url, None, str(exc) or type(exc).__name__)
            self.log.append((time.time(), *outcome))
            self.sent.append((sent, *outcome))
            if outcome[2] is not None and "planted fault" not in outcome[2]:
                time.sleep(0.05)  # a server that is down is not hammered
                client.close()
                client = httpclient.InferenceServerClient(
                    url=url, connection_timeout=5.0, network_timeout=30.0
                )
        client.close()


def watched_under_traffic(
    urls: str | list[str],
    model: str,
    spec,
    failures: int = 10,
    duration_s: float = 60,
    answers_after: int = 20,
):
    """A planted regression under live traffic: clients send to every URL until each saw
    `failures` failed requests, the watch (in-process, acting on a breach) runs for
    `duration_s`, and the clients go on until `answers_after` more answers came, from what
    serves once the watch acted. Returns (the watch's looks, the traffic)."""
    from hf2triton.flows.watch import watch_release

    with Traffic(urls, model) as traffic:
        assert wait_until(
            lambda: all(len(traffic.failed_at(u)) >= failures for u in traffic.urls), 180
        ), "no failed requests came"
        seen = watch_release(spec, duration_s=duration_s)
        after = len(traffic.answered)
        assert wait_until(lambda: len(traffic.answered) >= after + answers_after, 180), (
            "no answers came after the watch"
        )
    return seen, traffic
