"""The serving benchmark's load points: hf2triton.release.load's closed loop (N concurrent clients,
one sentence per request, bounded in time and in count) with the CPU time of the client, of the
server's process tree and of the whole machine measured over the same window, and the clients
it drives (Triton over gRPC and HTTP, a JSON-over-HTTP baseline).
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

from hf2triton.clients.triton import TritonGrpc as GrpcCall
from hf2triton.release.load import closed_loop

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
        out[int(stat.parent.name)] = (
            head.split("(", 1)[1],
            (int(fields[11]) + int(fields[12])) / CLK_TCK,
        )
    return out


def top_others(
    before: dict, after: dict, exclude: set[int], seconds: float, n: int = 3
) -> list[tuple[int, str, float]]:
    """The processes (not ours) that used the most CPU between two all_cpu() snapshots."""
    use = [
        (pid, name, (cpu - before.get(pid, (name, 0.0))[1]) / seconds)
        for pid, (name, cpu) in after.items()
        if pid not in exclude
    ]
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


class CpuMeter:
    """The CPU of this process, of the server's process tree and of the whole machine over the
    load's measured window (a `hf2triton.release.load.Window`)."""

    def __init__(self, server_pid: int | None):
        self.server_pid = server_pid

    def start(self) -> None:
        self.c0, self.s0, (self.m0, _) = self_cpu(), tree_cpu(self.server_pid), machine_busy()
        self.snap0 = all_cpu()

    def stop(self) -> None:
        self.c1, self.s1, (self.m1, _) = self_cpu(), tree_cpu(self.server_pid), machine_busy()
        self.snap1 = all_cpu()

    def cores(self, seconds: float) -> dict[str, Any]:
        client = (self.c1 - self.c0) / seconds
        server = (self.s1 - self.s0) / seconds
        machine = (self.m1 - self.m0) / seconds
        return {
            "client_cores": client,
            "server_cores": server,
            "machine_cores": machine,
            "other_cores": max(0.0, machine - client - server),
            "top_others": top_others(
                self.snap0, self.snap1, {os.getpid(), *process_tree(self.server_pid or 0)}, seconds
            ),
        }


async def measure(
    call: Callable[[str], Awaitable[Any]],
    texts: list[str],
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    max_requests: int,
    server_pid: int | None,
    label: str = "",
    request_timeout_s: float = 30.0,
) -> PointResult:
    """One load point (hf2triton.release.load's closed loop) with the CPU everyone used meanwhile.
    `warmup_s` should exceed one round of latency at this concurrency, so the window sees
    steady state."""
    meter = CpuMeter(server_pid)
    r = await closed_loop(
        call, texts, concurrency, duration_s, warmup_s, max_requests, request_timeout_s, meter
    )
    return PointResult(
        label=label,
        concurrency=concurrency,
        requests=r.requests,
        errors=r.errors,
        seconds=round(r.seconds, 3),
        rps=r.rps,
        p50_ms=r.p50_ms,
        p90_ms=r.p90_ms,
        p99_ms=r.p99_ms,
        mean_ms=r.mean_ms,
        first_error=r.failures[0] if r.failures else None,
        **meter.cores(r.seconds),
    )


# --- the clients: Triton over gRPC and HTTP, and a plain JSON-over-HTTP baseline server --------


def text_inputs(text: str) -> dict[str, np.ndarray]:
    """One text as Triton's TEXT input [1, 1]."""
    return {"TEXT": np.array([[text.encode("utf-8")]], dtype=np.object_)}


class TritonGrpc:
    """One text a request to a Triton model over gRPC (hf2triton.release.load.TritonGrpc: one
    channel,
    many concurrent calls on it)."""

    def __init__(
        self,
        url: str,
        model: str,
        version: str = "",
        output: str = "EMBEDDING",
        inputs: Callable[[str], dict[str, np.ndarray]] = text_inputs,
    ):
        self.grpc = GrpcCall(url, model, version, outputs=(output,))
        self.output, self.inputs = output, inputs

    async def __call__(self, text: str) -> np.ndarray:
        return (await self.grpc(self.inputs(text))).as_numpy(self.output)

    async def close(self) -> None:
        await self.grpc.close()


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
        res = await self.client.infer(
            self.model, [inp], model_version=self.version, outputs=self.outputs
        )
        return res.as_numpy("EMBEDDING")

    async def close(self) -> None:
        await self.client.close()


class JsonHttp:
    """POST a JSON body for each text to an HTTP embedding server (aiohttp): the FastAPI
    baseline's {"text": ...}, or an OpenAI-style {"model": ..., "input": [...]} (infinity-emb)."""

    def __init__(
        self,
        url: str,
        conn_limit: int = 100,
        openai_model: str | None = None,
        extra: dict[str, Any] | None = None,
    ):
        import aiohttp

        self.url, self.openai_model, self.extra = url, openai_model, extra or {}
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=conn_limit),
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def __call__(self, text: str) -> list[float]:
        body = (
            {"text": text}
            if self.openai_model is None
            else {"model": self.openai_model, "input": [text], **self.extra}
        )
        async with self.session.post(self.url, json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            answer = await resp.json()
            return (
                answer["embedding"] if self.openai_model is None else answer["data"][0]["embedding"]
            )

    async def close(self) -> None:
        await self.session.close()


def run_point(
    make_client: Callable[[int], Any],
    texts: list[str],
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    max_requests: int,
    server_pid: int | None,
    label: str,
) -> PointResult:
    """One load point on a fresh event loop and fresh client (connections are part of it)."""

    async def main() -> PointResult:
        client = make_client(concurrency)
        try:
            return await measure(
                client, texts, concurrency, duration_s, warmup_s, max_requests, server_pid, label
            )
        finally:
            await client.close()

    return asyncio.run(main())
