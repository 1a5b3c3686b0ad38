"""Soak test of a served embedder: N concurrent gRPC clients, one sentence per request, for a
fixed time against 127.0.0.1; reports failed requests, p50/p99 per window and the memory of the
Triton process tree (server + Python-backend stubs) after warm-up and at the end.

    .venv/bin/python benchmarks/soak.py --minutes 10 --clients 64

Without --url it releases the default MiniLM spec into a private hf2triton home on free ports
first (and stops that server at the end). Results: benchmarks/results/soak-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's hf2triton, not an installed one
RESULTS = ROOT / "benchmarks" / "results"

from load import TritonGrpc, process_tree  # noqa: E402 - benchmarks/, the script's directory

from hf2triton.release.load import LoadResult, closed_loop  # noqa: E402
from hf2triton.util.net import free_ports  # noqa: E402


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants (MB)."""
    total = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def release(home: Path) -> tuple[str, int, str]:
    spec = yaml.safe_load((ROOT / "releases" / "minilm-embedder.yaml").read_text())
    spec["validation"]["sentences"] = str(ROOT / "releases" / "data" / "embedding-validation.txt")
    http, grpc, metrics, api = free_ports(4)
    spec["deploy"].update(
        http_port=http, grpc_port=grpc, metrics_port=metrics, openai={"port": api}
    )
    spec.pop("schedule", None)
    path = home / "soak-spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "HF2TRITON_HOME": str(home)}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "hf2triton"), "release", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        sys.exit(f"release failed: {proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout)
    state = json.loads((home / "triton" / "server.json").read_text())
    return summary["endpoint"]["grpc"], state["pid"], summary["endpoint"]["model"]


def windowed(latencies: list[tuple[float, float]], seconds: float, window: float) -> list[dict]:
    """Requests/s and latency percentiles per window of `window` seconds, by answer time."""
    windows = []
    for lo in np.arange(0, seconds, window):
        ms = [m for t, m in latencies if lo <= t < lo + window]
        if ms:
            windows.append(
                {
                    "from_s": float(lo),
                    "requests": len(ms),
                    "rps": round(len(ms) / window, 1),
                    "p50_ms": round(float(np.percentile(ms, 50)), 1),
                    "p99_ms": round(float(np.percentile(ms, 99)), 1),
                }
            )
    return windows


async def soak(
    url: str, model: str, pid: int, clients: int, seconds: float, warmup: float, window: float
) -> dict:
    sentences = [
        line
        for line in (ROOT / "releases" / "data" / "embedding-validation.txt")
        .read_text()
        .splitlines()
        if 3 <= len(line.split()) <= 40
    ]
    loop = asyncio.get_running_loop()
    started = loop.time()
    memory: list[tuple[float, float]] = []
    done = asyncio.Event()

    async def sample_memory() -> None:
        while not done.is_set():
            memory.append((loop.time() - started, tree_rss_mb(pid)))
            try:
                await asyncio.wait_for(done.wait(), 5)
            except TimeoutError:
                pass

    async def drive() -> LoadResult:
        call = TritonGrpc(url, model, output="EMBEDDING")
        try:
            # Every request counts, warm-up included: the windows show the warm-up apart.
            return await closed_loop(call, sentences, clients, seconds, max_errors=10**9)
        finally:
            done.set()
            await call.close()

    _, found = await asyncio.gather(sample_memory(), drive())
    memory.append((loop.time() - started, tree_rss_mb(pid)))
    latencies = list(zip(found.answered_at_s, found.latencies_ms))
    failures = found.failures

    windows = windowed(latencies, seconds, window)
    after_warmup = next((m for t, m in memory if t >= warmup), memory[0][1])
    steady = [w["p99_ms"] for w in windows if w["from_s"] >= warmup]
    return {
        "clients": clients,
        "seconds": seconds,
        "requests": len(latencies),
        "failed": found.errors,
        "failures": failures,
        "rps": round(len(latencies) / seconds, 1),
        "p50_ms": round(float(np.percentile([m for _, m in latencies], 50)), 1),
        "p99_ms": round(float(np.percentile([m for _, m in latencies], 99)), 1),
        "memory_mb_after_warmup": round(after_warmup, 1),
        "memory_mb_end": round(memory[-1][1], 1),
        "memory_growth": round(memory[-1][1] / after_warmup - 1, 4),
        "p99_steady_min_ms": min(steady) if steady else None,
        "p99_steady_max_ms": max(steady) if steady else None,
        "windows": windows,
        "memory": memory,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--warmup-seconds", type=float, default=60)
    parser.add_argument("--window-seconds", type=float, default=30)
    parser.add_argument("--url", help="host:grpc_port of a served model (default: release one)")
    parser.add_argument("--model", default="minilm-embedder")
    parser.add_argument("--pid", type=int, help="tritonserver pid (with --url)")
    args = parser.parse_args()
    if not 1 <= args.clients <= 512 or not 0 < args.minutes <= 60:
        sys.exit("--clients must be 1..512 and --minutes 0..60")
    home = None
    if args.url:
        url, pid, model = args.url, args.pid, args.model
        if not url.startswith(("127.", "localhost")):
            sys.exit("soak only loopback addresses")
    else:
        home = Path(tempfile.mkdtemp(prefix="hf2triton-soak-"))
        url, pid, model = release(home)
    try:
        result = asyncio.run(
            soak(
                url,
                model,
                pid,
                args.clients,
                args.minutes * 60,
                args.warmup_seconds,
                args.window_seconds,
            )
        )
    finally:
        if home is not None:
            subprocess.run(
                [str(Path(sys.executable).parent / "hf2triton"), "server", "stop"],
                env={**os.environ, "HF2TRITON_HOME": str(home)},
                capture_output=True,
            )
    result["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    result["load_average"] = Path("/proc/loadavg").read_text().split()[:3]
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"soak-{result['date'][:10]}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    table = "\n".join(
        f"| {w['from_s']:.0f} | {w['rps']} | {w['p50_ms']} | {w['p99_ms']} |"
        for w in result["windows"]
    )
    stem.with_suffix(".md").write_text(
        f"# Soak {result['date']}: {args.clients} clients, {args.minutes:g} min\n\n"
        f"requests {result['requests']}, failed {result['failed']}, {result['rps']} req/s, "
        f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms; memory after warm-up "
        f"{result['memory_mb_after_warmup']} MB, at the end {result['memory_mb_end']} MB "
        f"(growth {result['memory_growth']:+.1%}); load average {result['load_average']}\n\n"
        f"| from s | req/s | p50 ms | p99 ms |\n|---|---|---|---|\n{table}\n"
    )
    print(json.dumps({k: v for k, v in result.items() if k not in ("windows", "memory")}))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
