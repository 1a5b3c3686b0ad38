"""The OpenAI-compatible API against Triton's own gRPC, on the default release, in one run,
reported as ratios.

releases/minilm-embedder.yaml is released into a private hf2triton home (a local Triton, and the
API beside it as every release starts it). Each round measures, in turn, at 64 closed-loop
clients on every-length traffic (`mixed`, as benchmarks/serving.py draws it: one text per
request):
- grpc: Triton's own protocol (tritonclient's asyncio gRPC, one channel);
- api: POST /v1/embeddings (aiohttp, JSON, one connection per client), what any OpenAI client
  sends, through the API to the same Triton;
- sdk: the `openai` SDK's AsyncOpenAI (httpx; base64 embeddings, its default), the client teams
  have: its own CPU is on the same 2 cores, so read it with `client_cores`.
The ratio api/grpc is the median over the rounds. With --aiperf, NVIDIA's AIPerf (its own
environment, benchmarks/.venv-aiperf, created on first use: a benchmark tool, not a dependency)
measures the embeddings endpoint too, and with --chat MODEL_DIR a text-generation release of
MODEL_DIR (releases/smollm2-135m-instruct.yaml's settings) through /v1/chat/completions, streaming:
time to first token, inter-token latency, output tokens/s.

    .venv/bin/python benchmarks/openai_api.py [--rounds 3] [--seconds 20] [--aiperf]
        [--chat DIR] [--quiet-wait 600]

Writes benchmarks/results/openai-api-<UTC time>.{json,md}. Everything runs on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness as bench  # noqa: E402
from load import JsonHttp, TritonGrpc, run_point  # noqa: E402

from hf2triton.util.net import free_ports  # noqa: E402

CLIENTS = 64
AIPERF = "aiperf==0.13.0"
MODEL = "minilm-embedder"


class OpenAISdk:
    """The openai SDK's async client, one embeddings request per text."""

    def __init__(self, base_url: str, model: str):
        import httpx
        import openai

        self.model = model
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key="unused",
            max_retries=0,
            # openai takes an httpx client as well as an httpx2 one; its types name httpx2 only.
            http_client=httpx.AsyncClient(  # type: ignore[arg-type]
                limits=httpx.Limits(max_connections=CLIENTS * 2), timeout=60
            ),
        )

    async def __call__(self, text: str):
        answer = await self.client.embeddings.create(model=self.model, input=[text])
        return answer.data[0].embedding

    async def close(self) -> None:
        await self.client.close()


def spec_file(path: Path, base: Path, ports: dict[str, int], api_port: int) -> Path:
    return bench.write_spec(path, base, ports, openai={"port": api_port})


def api_pid(home: Path) -> int | None:
    try:
        return json.loads((home / "triton" / "openai.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def point(make, texts, seconds: float, pid: int | None, label: str) -> dict:
    r = run_point(make, texts, CLIENTS, seconds, min(4.0, seconds / 2), 10**9, pid, label)
    bench.log(
        f"  {label} @{CLIENTS}: {r.rps:.1f}/s, p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} "
        f"ms, {r.errors} errors, client {r.client_cores:.2f} cores, other "
        f"{r.other_cores:.2f}"
    )
    return {
        "rps": r.rps,
        "p50_ms": r.p50_ms,
        "p99_ms": r.p99_ms,
        "errors": r.errors,
        "client_cores": r.client_cores,
        "server_cores": r.server_cores,
        "other_cores": r.other_cores,
        "first_error": r.first_error,
    }


# --- AIPerf --------------------------------------------------------------------------------------


def aiperf_env() -> Path:
    env = ROOT / "benchmarks" / ".venv-aiperf"
    if (env / "bin" / "aiperf").is_file():
        return env
    bench.log("aiperf: creating its environment (once)")
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    subprocess.run(
        [str(env / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", AIPERF],
        check=True,
        env={**os.environ, "PIP_CACHE_DIR": str(ROOT / ".cache" / "pip")},
    )
    return env


def aiperf_command(
    env: Path,
    url: str,
    model: str,
    endpoint: str,
    tokenizer: Path,
    dataset: Path,
    concurrency: int,
    requests: int,
    out: Path,
) -> list[str]:
    return [
        str(env / "bin" / "aiperf"),
        "profile",
        "--model",
        model,
        "--url",
        url,
        "--endpoint-type",
        endpoint,
        "--tokenizer",
        str(tokenizer),
        "--input-file",
        str(dataset),
        "--custom-dataset-type",
        "single_turn",
        "--concurrency",
        str(concurrency),
        "--request-count",
        str(requests),
        "--output-artifact-dir",
        str(out),
        "--ui-type",
        "none",
        "--no-gpu-telemetry",
        "--no-server-metrics",
    ]


AIPERF_FIGURES = (
    "request_throughput",
    "request_latency",
    "time_to_first_token",
    "inter_token_latency",
    "output_token_throughput",
    "output_token_throughput_per_user",
    "output_sequence_length",
    "input_sequence_length",
    "request_count",
    "error_request_count",
)


def aiperf(
    url: str,
    model: str,
    endpoint: str,
    tokenizer: Path,
    texts: list[str],
    concurrency: int,
    requests: int,
    out: Path,
    extra: list[str] | None = None,
) -> dict:
    """One AIPerf profile: the prompts of `texts` (a custom single-turn dataset), `requests` of
    them at `concurrency`; its summary JSON's figures."""
    env = aiperf_env()
    out.mkdir(parents=True, exist_ok=True)
    dataset = out / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts if t.strip()))
    cmd = [
        *aiperf_command(env, url, model, endpoint, tokenizer, dataset, concurrency, requests, out),
        *(extra or []),
    ]
    bench.log("  aiperf: " + " ".join(cmd[1:]))
    # Not HF_HUB_OFFLINE: AIPerf 0.13.0 then looks a local tokenizer path up as a hub cache
    # entry and fails; online, it loads the path (no hub request is made for a directory).
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=1800,
        env={k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"},
    )
    (out / "aiperf.log").write_text(proc.stdout + proc.stderr)
    # A failed profile is recorded with its reason; the figures measured before it are kept.
    if proc.returncode != 0:
        bench.log(f"  aiperf failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-600:]}")
        return {"error": f"aiperf exited {proc.returncode}; see aiperf.log beside the record"}
    found = sorted(out.rglob("profile_export_aiperf.json"))
    if not found:
        return {"error": f"aiperf wrote no profile_export_aiperf.json under {out}"}
    summary = json.loads(found[-1].read_text())
    return {k: summary[k] for k in AIPERF_FIGURES if k in summary}


def chat_release(
    tmp: Path, home: Path, model_dir: Path, ports: dict[str, int], api_port: int, cli: list[str]
) -> dict:
    """MODEL_DIR released as a user releases a small chat model: releases/
    smollm2-135m-instruct.yaml with the source replaced (96 new tokens at most, a context of
    512, as issue 27 measured the engines), on this machine's fastest passing runtime."""
    spec = yaml.safe_load((ROOT / "releases" / "smollm2-135m-instruct.yaml").read_text())
    spec["name"] = spec["registry"]["model_name"] = "bench-chat"
    spec["source"] = {"path": str(model_dir)}
    spec["text_generation"].update(max_new_tokens=96, max_context=512)
    spec["validation"]["sentences"] = str(ROOT / "releases" / spec["validation"]["sentences"])
    spec.setdefault("deploy", {}).update(ports)
    spec["deploy"]["openai"] = {"port": api_port}
    spec.pop("schedule", None)
    path = tmp / "chat.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    summary, seconds = bench.release(cli, path, home, ROOT)
    bench.log(f"{spec['name']}: ships {summary['variant']} ({seconds:.0f} s)")
    return summary


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--aiperf", action="store_true")
    ap.add_argument(
        "--chat",
        type=Path,
        help="a causal LM directory released for the chat "
        "figures (AIPerf), with releases/smollm2-135m-instruct.yaml's "
        "settings",
    )
    ap.add_argument("--quiet-wait", type=float, default=600)
    return ap.parse_args()


def measured_rounds(
    rounds: int, texts: list[str], grpc_url: str, base: str, seconds: float, pid: int | None
) -> list[dict]:
    """Each round, in turn: Triton's gRPC, the API's /v1/embeddings, the openai SDK."""
    out = []
    for i in range(rounds):
        row = {
            "grpc": point(lambda n: TritonGrpc(grpc_url, MODEL), texts, seconds, pid, "grpc"),
            "api": point(
                lambda n: JsonHttp(f"{base}/embeddings", conn_limit=CLIENTS, openai_model=MODEL),
                texts,
                seconds,
                pid,
                "api",
            ),
            "sdk": point(lambda n: OpenAISdk(base, MODEL), texts, seconds, pid, "sdk"),
        }
        out.append(row)
        bench.log(f"round {i + 1}: api/grpc {row['api']['rps'] / row['grpc']['rps']:.3f}")
    return out


def chat_figures(
    a: argparse.Namespace,
    tmp: Path,
    home: Path,
    ports: dict[str, int],
    api_port: int,
    cli: list[str],
    texts: list[str],
) -> dict:
    """a.chat released beside the embedder, and AIPerf's streamed chat figures at 1, 8 and 32."""
    chat = chat_release(tmp, home, a.chat, ports, api_port, cli)
    name = chat["endpoint"]["model"]
    prompts = [t for t in texts if t.strip()][:400]
    out = {"variant": chat["variant"], "model_dir": str(a.chat)}
    for concurrency, requests in ((1, 40), (8, 160), (32, 400)):
        out[f"aiperf_{concurrency}"] = aiperf(
            f"http://127.0.0.1:{api_port}",
            name,
            "chat",
            a.chat,
            prompts,
            concurrency,
            requests,
            tmp / f"aiperf-chat-{concurrency}",
            ["--streaming", "--prompt-output-tokens-mean", "64"],
        )
    return out


def measured(
    a: argparse.Namespace, out: dict, tmp: Path, home: Path, cli: list[str], texts: list[str]
) -> None:
    """The embedder released, its rounds measured, and AIPerf's figures where asked, into
    `out`."""
    http, grpc, metrics, api_port = free_ports(4)
    ports = {"http_port": http, "grpc_port": grpc, "metrics_port": metrics}
    summary, seconds = bench.release(
        cli,
        spec_file(tmp / "spec.yaml", ROOT / "releases" / "minilm-embedder.yaml", ports, api_port),
        home,
        ROOT,
    )
    out["release"] = {
        "variant": summary["variant"],
        "release_s": round(seconds, 1),
        "endpoint": summary["endpoint"],
    }
    base = summary["endpoint"]["openai"]
    bench.log(f"{MODEL}: ships {summary['variant']}; API {base}")
    pid = bench.server_pid(home)
    out["rounds"] = measured_rounds(a.rounds, texts, f"127.0.0.1:{grpc}", base, a.seconds, pid)
    out["api_process"] = api_pid(home)
    if a.aiperf:
        out["aiperf_embeddings"] = aiperf(
            f"http://127.0.0.1:{api_port}",
            MODEL,
            "embeddings",
            bench.minilm_dir(),
            texts[:2000],
            CLIENTS,
            2000,
            tmp / "aiperf-embeddings",
        )
    if a.chat:
        out["chat"] = chat_figures(a, tmp, home, ports, api_port, cli, texts)


def summary_lines(out: dict) -> list[str]:
    lines = [
        f"# OpenAI-compatible API, {out['date']}, commit {out['commit']}",
        "",
        f"`{out['command']}`; {CLIENTS} clients, every-length traffic "
        f"{json.dumps(out['traffic'])}; ships `{out['release']['variant']}`",
        "",
        "| round | grpc/s | api/s | sdk/s | api/grpc |",
        "|---|---|---|---|---|",
        *(
            f"| {i + 1} | {r['grpc']['rps']:.1f} | {r['api']['rps']:.1f} | "
            f"{r['sdk']['rps']:.1f} | {r['api']['rps'] / r['grpc']['rps']:.3f} |"
            for i, r in enumerate(out["rounds"])
        ),
        "",
        *(f"- {k}: **{v:.3f}x**" for k, v in out["ratios"].items()),
    ]
    for key in ("aiperf_embeddings",):
        if key in out:
            lines += ["", f"- {key}: {json.dumps(out[key])}"]
    if "chat" in out:
        lines += ["", f"chat: ships `{out['chat']['variant']}`"]
        lines += [
            f"- {k}: {json.dumps(v)}" for k, v in out["chat"].items() if k.startswith("aiperf")
        ]
    return lines


def main() -> None:
    a = arguments()
    quiet = bench.wait_for_quiet(max_wait_s=a.quiet_wait)
    texts = bench.traffic()["mixed"]
    cli = [str(ROOT / ".venv" / "bin" / "hf2triton")]
    out: dict = bench.record_header("openai_api.py", quiet, texts, CLIENTS)
    with tempfile.TemporaryDirectory(prefix="hf2triton-openai-") as tmp_dir:
        tmp, home = Path(tmp_dir), Path(tmp_dir) / "home"
        try:
            measured(a, out, tmp, home, cli, texts)
        finally:
            bench.stop_server(cli, home, ROOT)
            keep = ROOT / "benchmarks" / "results" / "aiperf-artifacts"
            for found in tmp.glob("aiperf-*"):
                shutil.rmtree(keep / found.name, ignore_errors=True)
                shutil.copytree(found, keep / found.name, dirs_exist_ok=True)

    def median(f) -> float:
        return float(np.median([f(r) for r in out["rounds"]]))

    out["ratios"] = {
        "api_over_grpc": median(lambda r: r["api"]["rps"] / r["grpc"]["rps"]),
        "sdk_over_grpc": median(lambda r: r["sdk"]["rps"] / r["grpc"]["rps"]),
        "api_p99_over_grpc_p99": median(lambda r: r["api"]["p99_ms"] / r["grpc"]["p99_ms"]),
    }
    lines = summary_lines(out)
    bench.save_record("openai-api", out, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
