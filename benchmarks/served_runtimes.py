"""The default release as it now ships against today's ONNX Runtime fp32 release, both served by
one tritonserver, on every-length traffic, in alternating rounds, reported as ratios.

Two releases of all-MiniLM-L6-v2 into one hf2triton home (one local Triton, two model names):
- `minilm-embedder`: releases/minilm-embedder.yaml as it is (runtime.candidates auto: the
  fastest candidate that passes the gate ships; on a CPU with AVX512_BF16, OpenVINO bf16);
- `minilm-ort-fp32`: the same spec with runtime.candidates [onnxruntime fp32]: what every
  release shipped before runtimes were plug-ins.
Each round measures, for each release in turn, served texts/s at 64 closed-loop gRPC clients
(one text per request, `mixed` traffic: texts of every length, as benchmarks/serving.py draws
them) and the in-process limit of the same version directory (its serving core, dynamic batches
of 64 sorted into token-bounded sub-batches); the ratios are the medians over the rounds.
With --infinity, infinity-emb 0.0.78 (torch engine) is measured on the same traffic.

    .venv/bin/python benchmarks/served_runtimes.py [--rounds 3] [--seconds 20] [--infinity]
        [--quiet-wait 600]

Each point records the CPU that other processes used during it (`other_cores`): on a shared
machine, read the ratios with it.

Writes benchmarks/results/runtimes-<UTC time>.{json,md}. Everything runs on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness as bench  # noqa: E402
import serving_measure  # noqa: E402
from load import JsonHttp, TritonGrpc, run_point  # noqa: E402
from serving_peers import INFINITY, infinity_server  # noqa: E402

from hf2triton.util.net import free_ports  # noqa: E402

ORT_FP32 = [{"name": "onnxruntime", "precision": "fp32"}]
CLIENTS = 64


def spec_file(path: Path, name: str, ports: dict[str, Any], runtimes: list | None) -> Path:
    spec = yaml.safe_load((ROOT / "releases" / "minilm-embedder.yaml").read_text())
    spec["name"] = spec["registry"]["model_name"] = name
    spec["validation"]["sentences"] = str(ROOT / "releases" / spec["validation"]["sentences"])
    spec["deploy"].update(ports)
    spec.pop("schedule", None)
    if runtimes is not None:
        spec["runtime"] = {"candidates": runtimes}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def served(grpc: str, model: str, texts: list[str], seconds: float, pid: int | None) -> dict:
    r = run_point(
        lambda n: TritonGrpc(grpc, model),
        texts,
        CLIENTS,
        seconds,
        min(4.0, seconds / 2),
        10**9,
        pid,
        f"{model}@{CLIENTS}",
    )
    bench.log(
        f"  {model} served @{CLIENTS}: {r.rps:.1f}/s, p50 {r.p50_ms:.0f} ms, "
        f"p99 {r.p99_ms:.0f} ms, {r.errors} errors"
    )
    return {
        "rps": r.rps,
        "p50_ms": r.p50_ms,
        "p99_ms": r.p99_ms,
        "errors": r.errors,
        "other_cores": r.other_cores,
    }


def limit(version_dir: Path, texts: list[str], seconds: float) -> float:
    rows = serving_measure.in_process(version_dir, texts, seconds)
    return rows["sorted_64"]["texts_per_s"]


def infinity(texts: list[str], seconds: float) -> dict:
    """infinity-emb 0.0.78 (torch engine, batch 32) on the same model and traffic, at 64
    clients (its own environment, benchmarks/.venv-infinity: a peer, not a dependency)."""
    (port,) = free_ports(1)
    with infinity_server(port) as pid:
        url = f"http://127.0.0.1:{port}/embeddings"
        name = str(bench.minilm_dir())
        point = serving_measure.point(
            lambda n: JsonHttp(url, openai_model=name),
            texts,
            CLIENTS,
            seconds,
            pid,
            "infinity mixed",
        )
    return {"package": INFINITY, "engine": "torch", "batch_size": 32, **point}


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--infinity", action="store_true")
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=600,
        help="seconds to wait for a quiet machine first (0: start at once)",
    )
    return ap.parse_args()


def released(tmp: Path, home: Path, cli: list[str], ports: dict[str, Any]) -> dict[str, dict]:
    """Both releases into one home (one Triton): what each ships, and its version."""
    releases = {}
    for name, runtimes in (("minilm-embedder", None), ("minilm-ort-fp32", ORT_FP32)):
        summary, seconds = bench.release(
            cli, spec_file(tmp / f"{name}.yaml", name, ports, runtimes), home, ROOT
        )
        releases[name] = {
            "variant": summary["variant"],
            "release_s": round(seconds, 1),
            "version": summary["endpoint"]["version"],
        }
        bench.log(f"{name}: ships {summary['variant']} ({seconds:.0f} s)")
    return releases


def measured_rounds(
    a: argparse.Namespace, releases: dict[str, dict], home: Path, grpc: int, texts: list[str]
) -> list[dict]:
    """Each round, each release in turn: served at CLIENTS, then its in-process limit."""
    pid = bench.server_pid(home)
    grpc_url = f"127.0.0.1:{grpc}"
    rounds = []
    for i in range(a.rounds):
        row = {}
        for name, rel in releases.items():
            version_dir = home / "triton" / "models" / name / rel["version"]
            row[name] = {
                **served(grpc_url, name, texts, a.seconds, pid),
                "in_process": limit(version_dir, texts, a.seconds / 2),
            }
        rounds.append(row)
        bench.log(f"round {i + 1}: {json.dumps(row)}")
    return rounds


def ratios(out: dict) -> dict[str, float]:
    """The medians over the rounds (and against infinity-emb where it was measured)."""
    new, old = "minilm-embedder", "minilm-ort-fp32"

    def median(f) -> float:
        return float(np.median([f(r) for r in out["rounds"]]))

    found = {
        "served_default_over_served_ort_fp32": median(lambda r: r[new]["rps"] / r[old]["rps"]),
        "served_over_in_process_default": median(lambda r: r[new]["rps"] / r[new]["in_process"]),
        "served_over_in_process_ort_fp32": median(lambda r: r[old]["rps"] / r[old]["in_process"]),
        "p99_default_over_ort_fp32": median(lambda r: r[new]["p99_ms"] / r[old]["p99_ms"]),
    }
    if out.get("infinity"):
        found["served_default_over_infinity"] = (
            median(lambda r: r[new]["rps"]) / out["infinity"]["rps"]
        )
    return found


def main() -> None:
    a = arguments()
    quiet = bench.wait_for_quiet(max_wait_s=a.quiet_wait)
    texts = bench.traffic()["mixed"]
    cli = [str(ROOT / ".venv" / "bin" / "hf2triton")]
    out: dict = bench.record_header("served_runtimes.py", quiet, texts, CLIENTS)
    from hf2triton.util.cpu import cpu_features

    out["cpu_features"] = cpu_features()
    with tempfile.TemporaryDirectory(prefix="hf2triton-runtimes-") as tmp_dir:
        tmp, home = Path(tmp_dir), Path(tmp_dir) / "home"
        http, grpc, metrics, api = free_ports(4)
        ports = {
            "http_port": http,
            "grpc_port": grpc,
            "metrics_port": metrics,
            "openai": {"port": api},
        }
        try:
            releases = released(tmp, home, cli, ports)
            rounds = measured_rounds(a, releases, home, grpc, texts)
        finally:
            bench.stop_server(cli, home, ROOT)
        out["releases"], out["rounds"] = releases, rounds
        if a.infinity:
            out["infinity"] = infinity(texts, a.seconds)
    out["ratios"] = ratios(out)
    lines = [
        f"# Served runtimes, {out['date']}, commit {out['commit']}",
        "",
        f"`{out['command']}`; {CLIENTS} gRPC clients, every-length traffic "
        f"{json.dumps(out['traffic'])}",
        "",
        *(f"- {k}: **{v:.2f}x**" for k, v in out["ratios"].items()),
        "",
        *(f"- {k} ships `{v['variant']}`" for k, v in out["releases"].items()),
    ]
    bench.save_record("runtimes", out, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
