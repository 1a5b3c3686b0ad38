"""Text generation through Triton against the engine's own limit, in one run: generated tokens/s,
time to first token (p50, p99) and the time between tokens (p50, p99) at 1, 8 and 32 concurrent
streams (64 with --levels), on traffic that looks real (prompts of every length from a few words
to about 60 tokens, greedy, `--max-new` new tokens each), for:

- served over HTTP `generate_stream`, a gRPC stream and the OpenAI-compatible
  `/v1/chat/completions` stream: the release (OpenVINO GenAI's continuous batching, the
  candidate the gate shipped, at the precision it shipped) through a real tritonserver and the
  API beside it, asked by asyncio closed-loop clients in this process;
- in-process (the limit): the same pipeline, built as the serving core builds it from the
  version's serving.json (same IR, precision, KV cache and scheduler), driven directly with the
  same token ids: no Triton, no client;
- PyTorch: transformers `generate` on left-padded batches as wide as the streams;
- llama.cpp's own server (`--llama-server BIN`: llama-server built from llama-cpp-python's
  source, `--parallel N --cont-batching`, the same model converted to GGUF at the served
  precision, greedy, streamed), when asked for.

Each level is a closed loop: N streams, each sending its next request when its last one ended;
level by level every way one after the other, so each ratio is of figures taken minutes apart.
The model is a Qwen2 of about 25M parameters with random weights (8 layers, hidden 512, vocab
1,500, context 512: tests/tiny_models.py `build_qwen2`; `--model DIR` for another).

    .venv/bin/python benchmarks/generation.py [--levels 1,8,32] [--max-new 96]
        [--model DIR] [--candidates auto|fp32|bf16] [--min-next-token-agreement X]
        [--llama-cpp SRC]

Writes benchmarks/results/generation-<UTC time>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REQUESTS = {1: 6, 8: 32, 32: 96, 64: 160}  # per level: a few rounds of every stream
Records = list[tuple[float, list[float]]]  # per request: when sent, when each token came


def traffic(tokenizer: Any, n: int, seed: int = 0) -> list[str]:
    """`n` prompts of 5 to 60 tokens (uniform), cut from the shipped text."""
    text = (ROOT / "releases" / "data" / "kjv-pentateuch.txt").read_text(encoding="utf-8")
    words = [w for line in text.splitlines() if not line.startswith("#") for w in line.split()]
    rng = np.random.default_rng(seed)
    out: list[str] = []
    while len(out) < n:
        want = int(rng.integers(5, 61))
        start = int(rng.integers(0, len(words) - 200))
        taken = words[start : start + want]
        while len(tokenizer.encode(" ".join(taken))) > want and len(taken) > 1:
            taken = taken[:-1]
        out.append(" ".join(taken))
    return out


def figures(records: Records, seconds: float) -> dict[str, Any]:
    ttft = [times[0] - sent for sent, times in records if times]
    # Inter-token latency per request, as AIPerf counts it: (last token - first) / (tokens - 1)
    # (pieces gathered into one response under load arrive together).
    itl = [(t[-1] - t[0]) / (len(t) - 1) for _, t in records if len(t) > 1]
    tokens = sum(len(t) for _, t in records)

    def pct(xs: list[float], q: float) -> float | None:
        return round(float(np.percentile(xs, q)) * 1000, 1) if xs else None

    return {
        "tokens_per_s": round(tokens / seconds, 1),
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p99_ms": pct(ttft, 99),
        "itl_p50_ms": pct(itl, 50),
        "itl_p99_ms": pct(itl, 99),
        "requests": len(records),
        "tokens": tokens,
        "seconds": round(seconds, 2),
    }


async def closed_loop(one: Any, prompts: list[str], streams: int) -> dict[str, Any]:
    """`streams` clients, each sending its next prompt (`await one(prompt)` -> token times)
    when its last one ended."""
    todo, records = list(prompts)[::-1], []

    async def client() -> None:
        while todo:
            prompt = todo.pop()
            sent = time.perf_counter()
            records.append((sent, await one(prompt)))

    started = time.perf_counter()
    await asyncio.gather(*[client() for _ in range(streams)])
    return figures(records, time.perf_counter() - started)


async def chat_stream_stamps(
    session: Any, url: str, model: str, messages: Any, max_new: int
) -> list[float]:
    """One streamed `/v1/chat/completions` request: a time for each generated token. The chunks
    carry text, not tokens: the usage's count is spread over the chunks' times."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_new,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stamps: list[float] = []
    used = 0
    async with session.post(url, json=body) as r:
        if r.status != 200:
            raise RuntimeError(await r.text())
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            used = (event.get("usage") or {}).get("completion_tokens", used)
            if event.get("choices") and event["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter())
    return list(np.linspace(stamps[0], stamps[-1], max(used, 1))) if stamps else []


class Served:
    """The release through Triton (HTTP generate_stream, a gRPC stream) or the API beside it."""

    def __init__(self, protocol: str, ports: dict[str, Any], model: str, max_new: int):
        self.protocol, self.ports, self.model, self.max_new = protocol, ports, model, max_new

    def run(self, prompts: list[str], streams: int) -> dict[str, Any]:
        return asyncio.run(self._run(prompts, streams))

    async def _run(self, prompts: list[str], streams: int) -> dict[str, Any]:
        import aiohttp

        if self.protocol == "grpc":
            return await self._grpc(prompts, streams)
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=900)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            one = self._http if self.protocol == "http" else self._openai
            return await closed_loop(lambda p: one(session, p), prompts, streams)

    async def _http(self, session: Any, prompt: str) -> list[float]:
        url = f"http://127.0.0.1:{self.ports['http_port']}/v2/models/{self.model}/generate_stream"
        body = {"text_input": prompt, "max_tokens": self.max_new, "stream": True}
        times: list[float] = []
        async with session.post(url, json=body) as r:
            if r.status != 200:
                raise RuntimeError(await r.text())
            async for line in r.content:
                if line.startswith(b"data:"):
                    ids = json.loads(line[5:]).get("output_ids", [])
                    n = sum(1 for i in (ids if isinstance(ids, list) else [ids]) if i >= 0)
                    times += [time.perf_counter()] * n
        return times

    async def _openai(self, session: Any, prompt: str) -> list[float]:
        url = f"http://127.0.0.1:{self.ports['openai']['port']}/v1/chat/completions"
        messages = [{"role": "user", "content": prompt}]
        return await chat_stream_stamps(session, url, self.model, messages, self.max_new)

    async def _grpc(self, prompts: list[str], streams: int) -> dict[str, Any]:
        import tritonclient.grpc as grpcclient
        import tritonclient.grpc.aio as aio

        url = f"127.0.0.1:{self.ports['grpc_port']}"
        clients = [aio.InferenceServerClient(url) for _ in range(streams)]
        free = list(clients)

        async def one(prompt: str) -> list[float]:
            client = free.pop()
            inputs = []
            for name, value, kind in (
                ("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES"),
                ("max_tokens", np.array([[self.max_new]], np.int32), "INT32"),
                ("stream", np.array([[True]]), "BOOL"),
            ):
                x = grpcclient.InferInput(name, list(value.shape), kind)
                x.set_data_from_numpy(value)
                inputs.append(x)

            async def requests() -> Any:
                yield {"model_name": self.model, "inputs": inputs}

            times: list[float] = []
            try:
                async for result, error in client.stream_infer(requests()):
                    if error:
                        raise RuntimeError(str(error))
                    ids = result.as_numpy("output_ids")
                    n = int((ids >= 0).sum()) if ids is not None else 0
                    times += [time.perf_counter()] * n
                    if result.get_response().parameters["triton_final_response"].bool_param:
                        break
            finally:
                free.append(client)
            return times

        try:
            return await closed_loop(one, prompts, streams)
        finally:
            for c in clients:
                await c.close()


class InProcess:
    """OpenVINO GenAI's pipeline built from the version's serving.json as the serving core builds
    it (GenAIModel.pipeline), driven directly: the limit of what the served engine can do."""

    def __init__(self, version_dir: Path, max_new: int):
        from hf2triton import serving
        from hf2triton.serving import genai, runtimes
        from hf2triton.serving.causal import ChatTokenizer

        cfg = serving.read_settings(str(version_dir))
        files = runtimes.open_model(str(version_dir / cfg["onnx"]), runtimes.settings_of(cfg))
        assert isinstance(files, runtimes.GenAIModelFiles), "not an OpenVINO GenAI release"
        self.pipe = genai.GenAIModel(files).pipeline(
            int(cfg["max_rows"]), int(cfg["step_tokens"]), int(cfg["max_context"])
        )
        self.tokenizer = ChatTokenizer(str(version_dir / cfg["tokenizer_file"]), cfg["tokenizer"])
        self.eos, self.max_new = [int(e) for e in cfg["eos_token_ids"]], max_new
        self.precision = files.settings.precision

    def run(self, prompts: list[str], streams: int) -> dict[str, Any]:
        import openvino as ov
        import openvino_genai as ovg

        todo, records = list(prompts)[::-1], []
        live: dict[int, tuple[Any, float, list[float]]] = {}
        ids = iter(range(1, 1 << 30))
        started = time.perf_counter()
        while todo or live:
            while todo and len(live) < streams:
                cfg = ovg.GenerationConfig()
                cfg.max_new_tokens, cfg.do_sample = self.max_new, False
                cfg.set_eos_token_id(self.eos[0])
                cfg.stop_token_ids = set(self.eos)
                tokens = ov.Tensor(np.asarray([self.tokenizer.encode(todo.pop())], np.int64))
                rid = next(ids)
                live[rid] = (self.pipe.add_request(rid, tokens, cfg), time.perf_counter(), [])
            self.pipe.step()
            now = time.perf_counter()
            for rid, (handle, sent, times) in list(live.items()):
                while handle.can_read():
                    for out in handle.read().values():
                        times += [now] * len(out.generated_ids)
                if handle.get_status() != ovg.GenerationStatus.RUNNING:
                    records.append((sent, times))
                    del live[rid]
        return figures(records, time.perf_counter() - started)


class Torch:
    """transformers `generate` on left-padded batches as wide as the streams."""

    def __init__(self, model_dir: Path, max_new: int):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch, self.max_new = torch, max_new
        self.tok = AutoTokenizer.from_pretrained(str(model_dir), padding_side="left")
        self.tok.pad_token = self.tok.pad_token or self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()

    def run(self, prompts: list[str], streams: int) -> dict[str, Any]:
        records: Records = []
        started = time.perf_counter()
        for i in range(0, len(prompts), streams):
            batch = prompts[i : i + streams]
            enc = self.tok(batch, return_tensors="pt", padding=True)
            sent = time.perf_counter()
            with self.torch.inference_mode():
                out = self.model.generate(
                    **enc,
                    do_sample=False,
                    max_new_tokens=self.max_new,
                    pad_token_id=self.tok.pad_token_id,
                )
            done = time.perf_counter()
            made = (out[:, enc["input_ids"].shape[1] :] != self.tok.pad_token_id).sum(dim=1)
            for n in made.tolist():  # a batch's tokens spread over its time
                records.append((sent, list(np.linspace(sent, done, int(n) + 1)[1:])))
        return figures(records, time.perf_counter() - started)


# llama.cpp's converter, told that a byte-level BPE tokenizer it does not know by its hash (the
# benchmark's own, trained here) splits text as GPT-2's does, which is what its pre-tokenizer is.
CONVERT = """
import runpy, sys
src = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base as base
for cls in vars(base).values():
    if isinstance(cls, type) and "get_vocab_base_pre" in vars(cls):
        cls.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


class LlamaServer:
    """llama.cpp's own server on the same model converted to GGUF at `precision` (f32 or bf16),
    started per level with as many parallel slots as streams, 2 threads, greedy, streamed."""

    def __init__(self, source: Path, model_dir: Path, work: Path, precision: str, max_new: int):
        self.binary, self.max_new = source / "build" / "bin" / "llama-server", max_new
        outtype = {"fp32": "f32", "bf16": "bf16"}.get(precision, "f32")
        self.gguf = work / f"model-{outtype}.gguf"
        subprocess.run(
            [
                sys.executable,
                "-c",
                CONVERT,
                str(source),
                str(model_dir),
                "--outtype",
                outtype,
                "--outfile",
                str(self.gguf),
            ],
            check=True,
            capture_output=True,
        )

    def run(self, prompts: list[str], streams: int) -> dict[str, Any]:
        from hf2triton.util.net import free_port
        from hf2triton.util.waiting import http_ok, wait_for

        port = free_port()
        proc = subprocess.Popen(
            [
                str(self.binary),
                "-m",
                str(self.gguf),
                "--port",
                str(port),
                "-t",
                "2",
                "--parallel",
                str(streams),
                "--cont-batching",
                "-c",
                str(512 * streams),
                "--no-webui",
                "-ngl",
                "0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(
                lambda: http_ok(f"http://127.0.0.1:{port}/health"),
                120,
                "llama-server did not start",
                proc,
            )
            return asyncio.run(self._run(port, prompts, streams))
        finally:
            proc.terminate()
            proc.wait(30)

    async def _run(self, port: int, prompts: list[str], streams: int) -> dict[str, Any]:
        import aiohttp

        async with aiohttp.ClientSession(
            # llama-server closes a connection after a stream: no reuse
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=900),
        ) as session:

            async def one(prompt: str) -> list[float]:
                body = {
                    "prompt": prompt,
                    "n_predict": self.max_new,
                    "stream": True,
                    "temperature": 0.0,
                    "return_tokens": True,
                    "cache_prompt": False,
                }
                times: list[float] = []
                async with session.post(f"http://127.0.0.1:{port}/completion", json=body) as r:
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            event = json.loads(line[6:])
                            n = len(event.get("tokens") or ([] if event.get("stop") else [0]))
                            times += [time.perf_counter()] * n
                return times

            return await closed_loop(one, prompts, streams)


def release(
    model_dir: Path,
    name: str,
    home: Path,
    ports: dict,
    max_new: int,
    rows: int,
    candidates: Any,
    **generation: Any,
) -> dict:
    """Release `model_dir` as `name` on OpenVINO GenAI (`candidates`: the runtime's own auto
    list, or one precision), in a child process (its own Prefect, MLflow and the local Triton
    it leaves running)."""
    import yaml
    from tokenizers import Tokenizer

    from tests.conftest import write_spec

    prompts = home.parent / "prompts.txt"

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompts.write_text("\n".join(traffic(tok, 24, seed=1)) + "\n")
    spec = write_spec(
        home.parent / f"{name}.yaml",
        name=name,
        task="text-generation",
        embedding=None,
        source__package=None,
        source__subdir=None,
        source__path=str(model_dir),
        source__model_id="bench/qwen2",
        registry__model_name=name,
        text_generation={
            "max_new_tokens": max_new,
            "max_context": 512,
            "max_rows": rows,
            "gate_tokens": 16,
            **generation,
        },
        runtime__candidates=candidates,
        quantization__method="none",
        validation__sentences=str(prompts),
        validation__smoke_sentences=4,
        validation__judge_all=True,
        deploy__max_batch_size=rows,
        deploy__preferred_batch_sizes=[rows],
        **{f"deploy__{k}": v for k, v in ports.items()},
    )
    data = yaml.safe_load(spec.read_text())
    data.pop("watch", None)
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "HF2TRITON_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "hf2triton"), "release", str(spec)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise SystemExit(f"release {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| way | streams | tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, per in results.items():
        for c, r in per.items():
            lines.append(
                f"| {name} | {c} | {r['tokens_per_s']} | {r['ttft_p50_ms']} | "
                f"{r['ttft_p99_ms']} | {r['itl_p50_ms']} | {r['itl_p99_ms']} |"
            )
    return lines


def ratios(results: dict[str, dict[str, Any]], levels: list[int]) -> dict[str, float | None]:
    def rate(way: str, c: int) -> float | None:
        found = results.get(way, {}).get(str(c))
        return found["tokens_per_s"] if found else None

    out: dict[str, float | None] = {}
    for c in levels:
        limit, torch, llama = (
            rate("in-process (limit)", c),
            rate("pytorch", c),
            rate("llama.cpp", c),
        )
        for way in ("http", "grpc", "openai"):
            served = rate(f"served {way}", c)
            if served and limit:
                out[f"{way}_over_in_process_at_{c}"] = round(served / limit, 2)
            if served and torch:
                out[f"{way}_over_pytorch_at_{c}"] = round(served / torch, 2)
            if served and llama:
                out[f"{way}_over_llama_cpp_at_{c}"] = round(served / llama, 2)
    low, high = min(levels), max(levels)
    for way in ("http", "grpc", "openai"):
        a, b = rate(f"served {way}", high), rate(f"served {way}", low)
        if a and b:
            out[f"{way}_at_{high}_over_at_{low}"] = round(a / b, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--max-new", type=int, default=96)
    parser.add_argument("--model", type=Path, help="a causal LM directory")
    parser.add_argument(
        "--candidates",
        default="auto",
        help="auto: OpenVINO GenAI's own list, judged by the gate; or fp32/bf16",
    )
    parser.add_argument(
        "--min-next-token-agreement",
        type=float,
        help="the gate's limit (default 0.95): a random model's bf16 is borderline at 0.95, so "
        "measuring its speed needs a lower one (a trained model's does not)",
    )
    parser.add_argument(
        "--llama-cpp", type=Path, help="a llama.cpp source tree with build/bin/llama-server"
    )
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    from hf2triton.targets import triton_local
    from hf2triton.util.cpu import cpu_features
    from hf2triton.util.net import free_port
    from tests.tiny_models import build_qwen2

    work = Path(tempfile.mkdtemp(prefix="generation-bench-"))
    model_dir = args.model or build_qwen2(work / "qwen2-25m", vocab_size=1500, max_positions=512)
    home = work / "home"
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    candidates = (
        [{"name": "openvino-genai", "precision": p} for p in ("fp32", "bf16")]
        if args.candidates == "auto"
        else [{"name": "openvino-genai", "precision": args.candidates}]
    )
    limits = (
        {"thresholds": {"min_next_token_agreement": args.min_next_token_agreement}}
        if args.min_next_token_agreement is not None
        else {}
    )
    summary = release(
        model_dir, "bench-genai", home, ports, args.max_new, max(levels), candidates, **limits
    )
    version_dir = home / "triton" / "models" / "bench-genai" / summary["endpoint"]["version"]
    limit = InProcess(version_dir, args.max_new)
    ways: dict[str, Any] = {
        "served http": Served("http", ports, "bench-genai", args.max_new),
        "served grpc": Served("grpc", ports, "bench-genai", args.max_new),
        "served openai": Served("openai", ports, "bench-genai", args.max_new),
        "in-process (limit)": limit,
        "pytorch": Torch(model_dir, args.max_new),
    }
    if args.llama_cpp:
        ways["llama.cpp"] = LlamaServer(
            args.llama_cpp, model_dir, work, limit.precision, args.max_new
        )
    results: dict[str, dict[str, Any]] = {name: {} for name in ways}
    try:
        for way in ways.values():  # warm
            way.run(traffic(limit.tokenizer, 2, seed=9), 1)
        for c in levels:
            prompts = traffic(limit.tokenizer, REQUESTS.get(c, 3 * c), seed=c)
            for name, way in ways.items():
                results[name][str(c)] = way.run(prompts, c)
                print(name, c, json.dumps(results[name][str(c)]), flush=True)
    finally:
        os.environ["HF2TRITON_HOME"] = str(home)
        triton_local.stop_server()
    found = ratios(results, levels)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    record = {
        "when": stamp,
        "commit": commit,
        "machine": platform.processor(),
        "cpu": cpu_features(),
        "model": str(args.model or "random Qwen2 25M (8 layers, hidden 512, vocab 1500, ctx 512)"),
        "max_new_tokens": args.max_new,
        "levels": levels,
        "shipped": summary["variant"],
        "precision": limit.precision,
        "gate": summary.get("metrics"),
        "results": results,
        "ratios": found,
    }
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"generation-{stamp}.json").write_text(json.dumps(record, indent=1))
    lines = [*table(results), "", *(f"- {k}: {v}x" for k, v in found.items() if v is not None)]
    (out / f"generation-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
