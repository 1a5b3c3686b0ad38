"""serving.py's comparisons: today's main (a checkout of BASELINE_COMMIT, its own code and spec)
and a peer, infinity-emb (torch engine, in an environment of its own)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from harness import ROOT, VENV, log, minilm_dir, release, server_pid, stop_server, write_spec
from load import JsonHttp
from serving_measure import point, served_points

from hf2triton.util.net import free_ports
from hf2triton.util.waiting import http_ok, wait_for

# "Today's main" when issue 14 was taken up: what the served figures are compared with.
BASELINE_COMMIT = "8fba8d3"
INFINITY = "infinity-emb[server,torch]==0.0.78"


def baseline_main(tmp: Path, mixes: dict, seconds: float) -> dict:
    """Today's main as a user has it: its own checkout, code and default spec, served the same
    way and measured with the same clients."""
    base = tmp / "main-checkout"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), BASELINE_COMMIT],
        check=True,
        capture_output=True,
    )
    try:
        http, grpc, metrics, api = free_ports(4)
        ports = {
            "http_port": http,
            "grpc_port": grpc,
            "metrics_port": metrics,
            "openai": {"port": api},
        }
        spec = write_spec(
            base / "releases" / "bench.yaml", base / "releases" / "minilm-embedder.yaml", ports
        )
        # Its own code first on the path; the pipeline and serving environments are this one's.
        env = {"PYTHONPATH": str(base), "HF2TRITON_SERVING_ENV": str(ROOT / ".venv-serving")}
        cli = [str(VENV / "python"), "-m", "hf2triton.cli"]
        home = tmp / "main-home"
        log(f"today's main ({BASELINE_COMMIT}): releasing its default spec")
        summary, wall = release(cli, spec, home, base, env)
        try:
            rows = served_points(
                f"127.0.0.1:{grpc}",
                None,
                mixes,
                {"mixed": [16, 64], "median": [16, 64]},
                seconds,
                server_pid(home),
                "main",
            )
        finally:
            stop_server(cli, home, base, env)
        return {
            "commit": BASELINE_COMMIT,
            "variant": summary["variant"],
            "wall_s": wall,
            "served": rows,
        }
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
            capture_output=True,
        )


# --- the peer: infinity-emb --------------------------------------------------------------------


def infinity_env() -> Path:
    """benchmarks/.venv-infinity (git-ignored): torch 2.13.0 from this machine's CPU wheel first,
    so nothing pulls a CUDA build, then infinity-emb."""
    env = ROOT / "benchmarks" / ".venv-infinity"
    pip = [str(env / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    cache = {**os.environ, "PIP_CACHE_DIR": str(ROOT / ".cache" / "pip")}
    if not (env / "bin" / "infinity_emb").is_file():
        log("infinity-emb: creating its environment (once)")
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([*pip, "torch==2.13.0"], check=True, env=cache)
        subprocess.run([*pip, INFINITY, "torch==2.13.0"], check=True, env=cache)
    # Images (CLIP): infinity fetches and decodes them with aiohttp and Pillow. Not its [vision]
    # extra: that pulls PyPI's torchvision, built for CUDA torch, which breaks transformers'
    # import on the CPU torch ("operator torchvision::nms does not exist").
    if not list((env / "lib").glob("python*/site-packages/aiohttp")):
        subprocess.run([*pip, "aiohttp", "pillow"], check=True, env=cache)
    return env


@contextlib.contextmanager
def infinity_server(port: int, model: Path | None = None, batch_size: int = 32):
    """infinity-emb serving `model` (default: the MiniLM of the text benchmarks) on `port`."""
    env = infinity_env()
    (ROOT / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
    log_file = open(ROOT / "benchmarks" / "results" / "infinity.log", "wb")
    proc = subprocess.Popen(
        [
            str(env / "bin" / "infinity_emb"),
            "v2",
            "--model-id",
            str(model or minilm_dir()),
            "--engine",
            "torch",
            "--batch-size",
            str(batch_size),
            "--device",
            "cpu",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            # BetterTransformer needs optimum, which its environment lacks: off, and said so.
            # Not --compile (off by default): it is not what a default install serves.
            "--no-bettertransformer",
        ],
        env={
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "DO_NOT_TRACK": "1",
            "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        },
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: http_ok(f"http://127.0.0.1:{port}/health"),
            600,
            "infinity-emb did not start (see benchmarks/results/infinity.log)",
            proc,
            interval_s=1,
            error=RuntimeError,
        )
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log_file.close()


def peer(mixes: dict, seconds: float) -> dict:
    (port,) = free_ports(1)
    with infinity_server(port) as pid:
        url = f"http://127.0.0.1:{port}/embeddings"
        name = str(minilm_dir())
        out = {}
        for mix, clients in (("mixed", (16, 64)), ("median", (16, 64))):
            out[mix] = [
                point(
                    lambda n: JsonHttp(url, openai_model=name),
                    mixes[mix],
                    c,
                    seconds,
                    pid,
                    f"infinity {mix}",
                )
                for c in clients
            ]
    return {"package": INFINITY, "engine": "torch", "batch_size": 32, "served": out}
