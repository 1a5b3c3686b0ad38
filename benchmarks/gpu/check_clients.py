"""The GPU check's HTTP clients: the closed loop at N clients over several processes (each one
check.py's `_clients`), every text served once more, and the served embeddings' cosines with
PyTorch's."""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import subprocess
import sys
import threading
import time
from array import array
from pathlib import Path
from typing import Any

from gpu.check_meter import GpuMeter

# The script whose `_clients` command runs one process of closed_loop's clients.
CHECK = Path(__file__).with_name("check.py")


def infer_body(model: str, text: str) -> tuple[str, bytes]:
    body = {
        "inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [text]}],
        "outputs": [{"name": "EMBEDDING", "parameters": {"binary_data": True}}],
    }
    return f"/v2/models/{model}/infer", json.dumps(body, ensure_ascii=False).encode()


def embedding_of(response: http.client.HTTPResponse, data: bytes) -> bytes:
    """The binary EMBEDDING of an answer (after its JSON header)."""
    header = int(response.getheader("Inference-Header-Content-Length") or len(data))
    return data[header:]


def clients_main(args: argparse.Namespace) -> int:
    """One client process: `threads` closed-loop clients until `start_at + seconds`, counting
    what completes inside [start_at, start_at + seconds]; prints one JSON line."""
    texts = json.loads(Path(args.texts).read_text(encoding="utf-8"))
    bodies = [infer_body(args.model, t) for t in texts]
    end = args.start_at + args.seconds
    lock = threading.Lock()
    done: dict[str, Any] = {"ok": 0, "errors": 0, "first_error": None, "latencies_ms": []}

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=60)
        i = (k * 7919) % len(bodies)  # each client its own place in the texts
        mine: list[float] = []
        ok = errors = 0
        first = None
        while time.time() < end:
            path, body = bodies[i]
            i = (i + 1) % len(bodies)
            t0 = time.time()
            try:
                conn.request("POST", path, body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                good = response.status == 200
                if not good and first is None:
                    first = f"HTTP {response.status}"
            except (OSError, http.client.HTTPException) as exc:
                good, first = False, first or repr(exc)
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=60)
            t1 = time.time()
            if args.start_at <= t1 <= end:
                if good:
                    ok += 1
                    mine.append((t1 - t0) * 1000)
                else:
                    errors += 1
        conn.close()
        with lock:
            done["ok"] += ok
            done["errors"] += errors
            done["first_error"] = done["first_error"] or first
            done["latencies_ms"] += mine

    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(done))
    return 0


def closed_loop(
    port: int,
    model: str,
    texts_file: Path,
    clients: int,
    seconds: float,
    warm_s: float,
    meter: GpuMeter | None,
    probe: Any = None,
) -> dict[str, Any]:
    """`clients` HTTP clients in a closed loop, one text per request, texts of every length, in
    several processes (one Python process's threads cannot keep a GPU server busy). `probe`
    (start(), stop() -> dict): what else to watch over the measured window, as "server"."""
    procs_n = max(1, min(clients, 8, (os.cpu_count() or 2) // 2))
    start_at = time.time() + warm_s
    procs = []
    for k in range(procs_n):
        threads = clients // procs_n + (1 if k < clients % procs_n else 0)
        cmd = [
            sys.executable,
            str(CHECK),
            "_clients",
            f"--port={port}",
            f"--model={model}",
            f"--texts={texts_file}",
            f"--threads={threads}",
            f"--start-at={start_at}",
            f"--seconds={seconds}",
        ]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    if meter is not None:
        meter.start(start_at, start_at + seconds)
    cpu_busy, server = watched_window(start_at, seconds, probe)
    results = [json.loads(p.communicate(timeout=seconds + warm_s + 120)[0]) for p in procs]
    gpu = meter.stop() if meter is not None else None
    ok = sum(r["ok"] for r in results)
    latencies = sorted(x for r in results for x in r["latencies_ms"])

    def pct(q: float) -> float | None:
        return (
            round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)
            if latencies
            else None
        )

    return {
        "clients": clients,
        "processes": procs_n,
        "seconds": seconds,
        "texts_per_s": round(ok / seconds, 1),
        "errors": sum(r["errors"] for r in results),
        "first_error": next((r["first_error"] for r in results if r["first_error"]), None),
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "gpu_busy": gpu,
        "host_cpu_busy": cpu_busy,  # all cores, clients and server together
        "server": server,
    }


def watched_window(start_at: float, seconds: float, probe: Any) -> tuple[float | None, Any]:
    """Waits out the measured window: the host's busy share over it, and what `probe` saw."""
    time.sleep(max(0.0, start_at - time.time()))
    cpu_before = cpu_times()
    if probe is not None:
        probe.start()
    time.sleep(max(0.0, start_at + seconds - time.time()))
    cpu_busy = busy_share(cpu_before, cpu_times())
    return cpu_busy, probe.stop() if probe is not None else None


def cpu_times() -> list[int] | None:
    """The host's CPU times (/proc/stat's first line), None where there is none."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def busy_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """The share of every core's time not idle (idle and iowait) between two readings."""
    if not before or not after:
        return None
    delta = [a - b for a, b in zip(after, before)]
    total = sum(delta)
    idle = delta[3] + (delta[4] if len(delta) > 4 else 0)
    return round(1 - idle / total, 3) if total else None


def served_embeddings(port: int, model: str, texts: list[str], threads: int = 8) -> list[bytes]:
    out: list[bytes] = [b""] * len(texts)

    def worker(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for i in range(k, len(texts), threads):
            path, body = infer_body(model, texts[i])
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                raise RuntimeError(f"text {i}: HTTP {response.status}: {data[:300]!r}")
            out[i] = embedding_of(response, data)
        conn.close()

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    missing = [i for i, e in enumerate(out) if not e]
    if missing:
        raise RuntimeError(f"no embedding served for {len(missing)} texts (first: {missing[0]})")
    return out


def cosines(served: list[bytes], reference_file: Path, texts: list[str]) -> dict[str, Any]:
    """Cosine of each served embedding with PyTorch's (reference.f32: float32 rows, as pack.py
    wrote them); in plain Python, so that this process needs no numpy."""
    ref = array("f")
    ref.frombytes(reference_file.read_bytes())
    dim = len(ref) // len(texts)
    cos = []
    for i, blob in enumerate(served):
        got = array("f")
        got.frombytes(blob)
        if len(got) != dim:
            raise RuntimeError(f"text {i}: a served embedding of {len(got)} values, not {dim}")
        want = ref[i * dim : (i + 1) * dim]
        dot = sum(a * b for a, b in zip(got, want))
        norms = math.sqrt(sum(a * a for a in got)) * math.sqrt(sum(b * b for b in want))
        cos.append(dot / max(norms, 1e-12))
    worst = min(range(len(cos)), key=cos.__getitem__)
    return {
        "min": round(min(cos), 6),
        "mean": round(sum(cos) / len(cos), 6),
        "texts": len(texts),
        "worst_text": texts[worst][:80],
        "worst_text_chars": len(texts[worst]),
    }
