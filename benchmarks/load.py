"""Closed-loop load generation for the serving benchmark: N concurrent clients on one asyncio loop,
one sentence per request, bounded in time and in count, with the CPU time of the client, of the
server's process tree and of the whole machine measured over the same window.
"""

from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    """utime + stime of one process, in seconds (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (Triton's Python-backend stubs are its children)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def all_cpu() -> dict[int, tuple[str, float]]:
    """pid -> (command name, CPU seconds) of every process: who else used the machine."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        head, tail = text.rsplit(")", 1)
        fields = tail.split()
        out[int(stat.parent.name)] = (head.split("(", 1)[1],
                                      (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return out


def top_others(before: dict, after: dict, exclude: set[int], seconds: float,
               n: int = 3) -> list[tuple[int, str, float]]:
    """The processes (not ours) that used the most CPU between two all_cpu() snapshots."""
    use = [(pid, name, (cpu - before.get(pid, (name, 0.0))[1]) / seconds)
           for pid, (name, cpu) in after.items() if pid not in exclude]
    return [(p, nm, round(c, 2)) for p, nm, c in sorted(use, key=lambda x: -x[2])[:n] if c > 0.02]


def tree_cpu(pid: int | None) -> float:
    return sum(_proc_cpu(p) for p in process_tree(pid)) if pid else 0.0


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, summed over cores."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]  # idle + iowait
    total = sum(parts[:8])  # guest time is already counted in user
    return (total - idle) / CLK_TCK, total / CLK_TCK


def self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@dataclass
class PointResult:
    label: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    client_cores: float  # CPU the load generator used, in cores (1.0 = one core fully busy)
    server_cores: float  # CPU of the server's process tree, in cores
    machine_cores: float  # CPU of the whole machine, in cores
    other_cores: float  # what neither used: other processes on the machine
    first_error: str | None = None
    top_others: list | None = None  # [pid, command, cores] of the busiest other processes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Call = Callable[[str], Awaitable[Any]]


async def closed_loop(call: Call, texts: list[str], concurrency: int, duration_s: float,
                      warmup_s: float, max_requests: int, server_pid: int | None,
                      label: str = "", request_timeout_s: float = 30.0) -> PointResult:
    """Run `concurrency` clients, each sending its next request when the last one answered.

    Requests that complete inside the measured window (after `warmup_s`, for `duration_s` or
    until `max_requests` completed in it) count; their latency is send-to-answer. `warmup_s`
    should exceed one round of latency at this concurrency, so the window sees steady state.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    window: dict[str, float] = {}
    latencies: list[float] = []
    errors = [0]
    first_error: list[str] = []
    done_in_window = [0]
    answered = [0]

    async def client(i: int) -> None:
        k = i * 7919
        while not stop.is_set():
            text = texts[k % len(texts)]
            k += 1
            t0 = loop.time()
            try:
                await asyncio.wait_for(call(text), request_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is counted and one kept
                errors[0] += 1
                if not first_error:
                    first_error.append(f"{type(exc).__name__}: {exc}"[:300])
                if errors[0] > 1000:  # a dead server: stop rather than spin
                    stop.set()
                await asyncio.sleep(0.01)
                continue
            t1 = loop.time()
            answered[0] += 1
            # Completions inside the window count, whenever they were sent: at 200 clients a
            # request waits a good part of a second, and dropping those sent before the window
            # would undercount throughput.
            if "start" in window and "end" not in window:
                latencies.append(t1 - t0)
                done_in_window[0] += 1
                if done_in_window[0] >= max_requests:
                    stop.set()

    tasks = [asyncio.create_task(client(i)) for i in range(concurrency)]
    try:
        # Warm up for warmup_s, and on until each client has had an answer (a slow server at
        # 200 clients takes seconds for one round), but no longer than 5 x warmup_s.
        t_warm = loop.time()
        await asyncio.sleep(warmup_s)
        while answered[0] < concurrency and loop.time() - t_warm < 5 * warmup_s:
            await asyncio.sleep(0.1)
        errors[0] = 0
        c0, s0, (m0, _) = self_cpu(), tree_cpu(server_pid), machine_busy()
        snap0 = all_cpu()
        window["start"] = loop.time()
        try:
            await asyncio.wait_for(stop.wait(), duration_s)
        except asyncio.TimeoutError:
            pass
        window["end"] = loop.time()
        c1, s1, (m1, _) = self_cpu(), tree_cpu(server_pid), machine_busy()
        snap1 = all_cpu()
        stop.set()
        # Let in-flight requests finish (bounded), so the server is idle for the next point.
        await asyncio.wait(tasks, timeout=request_timeout_s)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    seconds = window["end"] - window["start"]
    lat = np.array(latencies) * 1000 if latencies else np.array([np.nan])
    client_cores = (c1 - c0) / seconds
    server_cores = (s1 - s0) / seconds
    machine_cores = (m1 - m0) / seconds
    return PointResult(
        label=label, concurrency=concurrency, requests=len(latencies), errors=errors[0],
        seconds=round(seconds, 3), rps=len(latencies) / seconds,
        p50_ms=float(np.percentile(lat, 50)), p90_ms=float(np.percentile(lat, 90)),
        p99_ms=float(np.percentile(lat, 99)), mean_ms=float(lat.mean()),
        client_cores=client_cores, server_cores=server_cores, machine_cores=machine_cores,
        other_cores=max(0.0, machine_cores - client_cores - server_cores),
        first_error=first_error[0] if first_error else None,
        top_others=top_others(snap0, snap1, {os.getpid(), *process_tree(server_pid or 0)},
                              window["end"] - window["start"]),
    )


# --- the clients: Triton over gRPC and HTTP, and a plain JSON-over-HTTP baseline server --------


def text_inputs(text: str) -> dict[str, np.ndarray]:
    """One text as Triton's TEXT input [1, 1]."""
    return {"TEXT": np.array([[text.encode("utf-8")]], dtype=np.object_)}


class TritonGrpc:
    """tritonclient.grpc.aio: one channel, many concurrent calls on it."""

    def __init__(self, url: str, model: str, version: str = "", output: str = "EMBEDDING",
                 inputs: Callable[[str], dict[str, np.ndarray]] = text_inputs):
        import tritonclient.grpc.aio as grpcaio

        self.m = grpcaio
        self.client = grpcaio.InferenceServerClient(url)
        self.model, self.version, self.output, self.inputs = model, version, output, inputs
        self.outputs = [grpcaio.InferRequestedOutput(output)]

    async def __call__(self, text: str) -> np.ndarray:
        inputs = []
        for name, arr in self.inputs(text).items():
            x = self.m.InferInput(name, list(arr.shape), "BYTES")
            x.set_data_from_numpy(arr)
            inputs.append(x)
        res = await self.client.infer(self.model, inputs, model_version=self.version,
                                      outputs=self.outputs)
        return res.as_numpy(self.output)

    async def close(self) -> None:
        await self.client.close()


class TritonHttp:
    """tritonclient.http.aio (aiohttp): one connection per concurrent client, binary outputs."""

    def __init__(self, url: str, model: str, version: str = "", conn_limit: int = 100):
        import tritonclient.http.aio as httpaio

        self.m = httpaio
        self.client = httpaio.InferenceServerClient(url, conn_limit=conn_limit)
        self.model, self.version = model, version
        self.outputs = [httpaio.InferRequestedOutput("EMBEDDING", binary_data=True)]

    async def __call__(self, text: str) -> np.ndarray:
        inp = self.m.InferInput("TEXT", [1, 1], "BYTES")
        inp.set_data_from_numpy(text_inputs(text)["TEXT"], binary_data=True)
        res = await self.client.infer(self.model, [inp], model_version=self.version,
                                      outputs=self.outputs)
        return res.as_numpy("EMBEDDING")

    async def close(self) -> None:
        await self.client.close()


class JsonHttp:
    """POST a JSON body for each text to an HTTP embedding server (aiohttp): the FastAPI
    baseline's {"text": ...}, or an OpenAI-style {"model": ..., "input": [...]} (infinity-emb)."""

    def __init__(self, url: str, conn_limit: int = 100, openai_model: str | None = None):
        import aiohttp

        self.url, self.openai_model = url, openai_model
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=conn_limit),
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def __call__(self, text: str) -> list[float]:
        body = {"text": text} if self.openai_model is None else \
            {"model": self.openai_model, "input": [text]}
        async with self.session.post(self.url, json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            answer = await resp.json()
            return answer["embedding"] if self.openai_model is None else \
                answer["data"][0]["embedding"]

    async def close(self) -> None:
        await self.session.close()


def run_point(make_client: Callable[[int], Any], texts: list[str], concurrency: int,
              duration_s: float, warmup_s: float, max_requests: int, server_pid: int | None,
              label: str) -> PointResult:
    """One load point on a fresh event loop and fresh client (connections are part of it)."""

    async def main() -> PointResult:
        client = make_client(concurrency)
        try:
            return await closed_loop(client, texts, concurrency, duration_s, warmup_s,
                                     max_requests, server_pid, label)
        finally:
            await client.close()

    return asyncio.run(main())
