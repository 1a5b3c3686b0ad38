"""Text generation through Triton: generated tokens/s, time to first token (p50, p99) and the
time between tokens (p50, p99) at 1, 8, 32 and 64 concurrent streams, on traffic that looks
real (prompts of every length, from a few words to a few hundred tokens, and outputs that end at
different lengths: each request asks for its own max_tokens), in one run, for:

- genai (served): the release on OpenVINO GenAI's continuous batching (runtime openvino-genai,
  fp32 pinned), through a real tritonserver over gRPC streams;
- today (served): the same model released on the serving core's own in-flight batching over
  ONNX Runtime fp32 (the engine text generation had before), through the same server;
- genai in-process (the limit): OpenVINO GenAI's ContinuousBatchingPipeline driven directly in
  this process with the same token ids, lengths and settings: no Triton, no client;
- pytorch: transformers `generate`, one request at a time, and batched (left-padded batches of
  as many prompts as there are streams).

Each served and in-process level is a closed loop: N streams, each sending its next request when
its last one ended. The model is a Qwen2 of about 25M parameters with random weights
(tests/tiny_models.py `build_qwen2`; `--model DIR` for another), greedy.

    .venv/bin/python benchmarks/generation.py [--levels 1,8,32,64] [--max-new 128]
        [--model DIR]

Writes benchmarks/results/generation-<UTC time>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REQUESTS = {1: 8, 8: 32, 32: 96, 64: 160}  # per level: a few rounds of every stream


def traffic(tokenizer, n: int, max_new: int, seed: int = 0) -> list[tuple[str, int]]:
    """(prompt, max_tokens) of `n` requests: prompts of 3 to about 300 tokens cut from the
    shipped text (short questions and long passages), and a max_tokens of 8 to `max_new` each,
    so streams end at different times."""
    text = (ROOT / "releases" / "data" / "kjv-pentateuch.txt").read_text(encoding="utf-8")
    words = [w for line in text.splitlines() if not line.startswith("#") for w in line.split()]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        # Most prompts short, some long: lengths log-uniform between 3 and 240 words.
        length = int(np.exp(rng.uniform(np.log(3), np.log(240))))
        start = int(rng.integers(0, len(words) - length))
        out.append((" ".join(words[start : start + length]), int(rng.integers(8, max_new + 1))))
    return out


def release(
    model_dir: Path, name: str, runtime: dict, home: Path, ports: dict, max_new: int, max_rows: int
) -> dict:
    """Release `model_dir` as `name` pinned to `runtime`, in a child process (its own
    Prefect, MLflow and the local Triton it leaves running)."""
    import yaml

    from tests.conftest import write_spec

    prompts = home.parent / "prompts.txt"
    prompts.write_text("\n".join(p for p, _ in traffic(None, 12, 16, seed=1)) + "\n")
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
            "max_rows": max_rows,
            "gate_tokens": 16,
        },
        runtime__candidates=[runtime],
        quantization__method="none",
        validation__sentences=str(prompts),
        validation__smoke_sentences=4,
        deploy__max_batch_size=max_rows,
        deploy__preferred_batch_sizes=[max_rows],
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


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes `pids` have used so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def server_pids(home: Path) -> list[int]:
    """tritonserver and its Python-backend stubs serving `home`'s models."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(home) in cmd and ("tritonserver" in cmd or "python_backend_stub" in cmd):
                found.append(int(proc.name))
    return found


class Served:
    """One stream at a time per client thread, over gRPC, to a model on Triton; with where the
    CPU went: this client's process, and the server's (tritonserver and its stubs)."""

    def __init__(self, url: str, model: str, home: Path):
        self.url, self.model, self.home = url, model, home

    def run(self, jobs: list[tuple[str, int]], clients: int) -> dict:
        import resource

        server = server_pids(self.home)
        before = (resource.getrusage(resource.RUSAGE_SELF), cpu_seconds(server))
        found = self._run(jobs, clients)
        after = (resource.getrusage(resource.RUSAGE_SELF), cpu_seconds(server))
        client = (after[0].ru_utime + after[0].ru_stime) - (before[0].ru_utime + before[0].ru_stime)
        return {
            **found,
            "client_cpu_s": round(client, 2),
            "server_cpu_s": round(after[1] - before[1], 2),
        }

    def _run(self, jobs: list[tuple[str, int]], clients: int) -> dict:
        import tritonclient.grpc as grpcclient

        todo: queue.Queue = queue.Queue()
        for job in jobs:
            todo.put(job)
        records: list[tuple[float, list[float], int]] = []
        lock = threading.Lock()

        def client() -> None:
            conn = grpcclient.InferenceServerClient(url=self.url)
            got: queue.Queue = queue.Queue()
            conn.start_stream(
                callback=lambda result, error: got.put((result, error, time.perf_counter()))
            )
            try:
                while True:
                    try:
                        prompt, max_tokens = todo.get_nowait()
                    except queue.Empty:
                        return
                    inputs = []
                    for name, value, kind in (
                        ("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES"),
                        ("max_tokens", np.array([[max_tokens]], np.int32), "INT32"),
                        ("stream", np.array([[True]]), "BOOL"),
                    ):
                        x = grpcclient.InferInput(name, list(value.shape), kind)
                        x.set_data_from_numpy(value)
                        inputs.append(x)
                    sent = time.perf_counter()
                    conn.async_stream_infer(self.model, inputs)
                    times, tokens = [], 0
                    while True:
                        result, error, at = got.get(timeout=600)
                        if error is not None:
                            raise RuntimeError(str(error))
                        ids = result.as_numpy("output_ids")
                        n = int((ids >= 0).sum()) if ids is not None else 0
                        if n:
                            times += [at] * n
                            tokens += n
                        params = result.get_response().parameters
                        if params["triton_final_response"].bool_param:
                            break
                    with lock:
                        records.append((sent, times, tokens))
            finally:
                conn.stop_stream()
                conn.close()

        return closed_loop(client, clients, records)


class InProcess:
    """OpenVINO GenAI's pipeline driven directly: the limit of what the served engine can do."""

    def __init__(self, ir_dir: str, tokenizer, max_rows: int):
        import openvino_genai as ovg

        self.ovg, self.tok = ovg, tokenizer
        scheduler = ovg.SchedulerConfig()
        scheduler.cache_size, scheduler.num_kv_blocks = 0, 0
        scheduler.max_num_seqs, scheduler.max_num_batched_tokens = max_rows, 512
        scheduler.dynamic_split_fuse = True
        self.pipe = ovg.ContinuousBatchingPipeline(
            ir_dir,
            scheduler,
            "CPU",
            {
                "INFERENCE_PRECISION_HINT": "f32",
                "KV_CACHE_PRECISION": "f32",
                "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
            },
        )
        self.eos = tokenizer.eos_token_id
        self.ids = 0

    def run(self, jobs: list[tuple[str, int]], clients: int) -> dict:
        import openvino as ov

        todo = list(jobs)[::-1]
        live: dict[int, tuple] = {}
        records = []
        started = time.perf_counter()

        def add() -> None:
            prompt, max_tokens = todo.pop()
            cfg = self.ovg.GenerationConfig()
            cfg.max_new_tokens, cfg.do_sample = max_tokens, False
            cfg.set_eos_token_id(self.eos)
            self.ids += 1
            ids = ov.Tensor(np.asarray([self.tok(prompt)["input_ids"]], np.int64))
            live[self.ids] = (self.pipe.add_request(self.ids, ids, cfg), time.perf_counter(), [])

        while todo or live:
            while todo and len(live) < clients:
                add()
            self.pipe.step()
            now = time.perf_counter()
            for rid, (handle, sent, times) in list(live.items()):
                while handle.can_read():
                    for out in handle.read().values():
                        times += [now] * len(out.generated_ids)
                if handle.get_status() != self.ovg.GenerationStatus.RUNNING:
                    records.append((sent, times, len(times)))
                    del live[rid]
        return figures(records, time.perf_counter() - started)


class Torch:
    """transformers `generate`: one request at a time, or left-padded batches of `clients`."""

    def __init__(self, model_dir: Path):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(str(model_dir), padding_side="left")
        self.tok.pad_token = self.tok.pad_token or self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()

    def run(self, jobs: list[tuple[str, int]], clients: int) -> dict:
        torch, records = self.torch, []
        started = time.perf_counter()
        for i in range(0, len(jobs), clients):
            batch = jobs[i : i + clients]
            enc = self.tok([p for p, _ in batch], return_tensors="pt", padding=True)
            sent = time.perf_counter()
            stamps: list[float] = []

            class Clock:  # when each step's tokens exist (the first call is the prompt)
                def __init__(self, stamps: list[float]):
                    self.stamps = stamps

                def put(self, value):
                    self.stamps.append(time.perf_counter())

                def end(self):
                    pass

            with torch.inference_mode():
                self.model.generate(
                    **enc,
                    do_sample=False,
                    streamer=Clock(stamps) if clients == 1 else None,
                    max_new_tokens=max(m for _, m in batch),
                    pad_token_id=self.tok.eos_token_id,
                )
            done = time.perf_counter()
            for _, max_tokens in batch:  # each request counts the tokens it asked for
                times = (
                    stamps[1 : 1 + max_tokens]
                    if clients == 1
                    else list(np.linspace(sent, done, max_tokens + 1)[1:])
                )
                records.append((sent, times, max_tokens))
        return figures(records, time.perf_counter() - started)


def closed_loop(client, clients: int, records: list) -> dict:
    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return figures(records, time.perf_counter() - started)


def figures(records: list[tuple[float, list[float], int]], seconds: float) -> dict:
    ttft = [times[0] - sent for sent, times, _ in records if times]
    # Inter-token latency per request, as AIPerf counts it: (last token - first) / (tokens - 1)
    # (pieces gathered into one response under load arrive together).
    itl = [(times[-1] - times[0]) / (len(times) - 1) for _, times, _ in records if len(times) > 1]
    tokens = sum(n for _, _, n in records)
    pct = lambda xs, q: round(float(np.percentile(xs, q)) * 1000, 1) if xs else None  # noqa: E731
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,8,32,64")
    parser.add_argument("--max-new", type=int, default=128, help="the longest max_tokens")
    parser.add_argument("--model", type=Path, help="a causal LM directory")
    parser.add_argument("--skip-pytorch", action="store_true")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    from transformers import AutoTokenizer

    from hf2triton.targets import triton_local
    from hf2triton.util.cpu import cpu_features
    from hf2triton.util.net import free_port
    from tests.tiny_models import build_qwen2

    work = Path(tempfile.mkdtemp(prefix="generation-bench-"))
    model_dir = args.model or build_qwen2(work / "qwen2-25m")
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    home = work / "home"
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    rows = max(levels)
    released = {
        "genai": release(
            model_dir,
            "bench-genai",
            {"name": "openvino-genai", "precision": "fp32"},
            home,
            ports,
            args.max_new,
            rows,
        ),
        "today": release(
            model_dir,
            "bench-today",
            {"name": "onnxruntime", "precision": "fp32"},
            home,
            ports,
            args.max_new,
            rows,
        ),
    }
    url = f"127.0.0.1:{ports['grpc_port']}"
    ir_dir = next(
        (home / "work" / "bench-genai" / "openvino-ir").glob("*/openvino_model.xml")
    ).parent
    ways: dict[str, Served | InProcess | Torch] = {
        "genai (served)": Served(url, "bench-genai", home),
        "today (served)": Served(url, "bench-today", home),
        "genai in-process (limit)": InProcess(str(ir_dir), tok, rows),
    }
    if not args.skip_pytorch:
        ways["pytorch"] = Torch(model_dir)
    results: dict = {name: {} for name in ways}
    try:
        for way in ways.values():  # warm
            way.run(traffic(tok, 2, 8, seed=9), 1)
        # Level by level, every way one after the other: each ratio is of figures taken
        # minutes apart at most, on a machine others may share.
        for c in levels:
            jobs = traffic(tok, REQUESTS.get(c, 2 * c), args.max_new, seed=c)
            for name, way in ways.items():
                if name == "pytorch" and c > 1:
                    continue
                results[name][str(c)] = way.run(jobs, c)
                print(name, c, json.dumps(results[name][str(c)]), flush=True)
            if "pytorch" in ways:
                results.setdefault("pytorch batched", {})[str(c)] = ways["pytorch"].run(jobs, c)
                print(
                    "pytorch batched", c, json.dumps(results["pytorch batched"][str(c)]), flush=True
                )
    finally:
        env = {**os.environ, "HF2TRITON_HOME": str(home)}
        os.environ.update(env)
        triton_local.stop_server()

    def ratio(a: str, b: str, c: int) -> float | None:
        x, y = results.get(a, {}).get(str(c)), results.get(b, {}).get(str(c))
        return round(x["tokens_per_s"] / y["tokens_per_s"], 2) if x and y else None

    ratios = {
        f"genai_served_over_{other}_at_{c}": ratio("genai (served)", name, c)
        for c in levels
        for other, name in (
            ("limit", "genai in-process (limit)"),
            ("today", "today (served)"),
            ("pytorch_batched", "pytorch batched"),
        )
    }
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    record = {
        "when": stamp,
        "commit": commit,
        "machine": platform.processor(),
        "cpu": cpu_features(),
        "model": str(args.model or "random Qwen2 25M"),
        "max_new_tokens": args.max_new,
        "levels": levels,
        "shipped": {k: v["variant"] for k, v in released.items()},
        "results": results,
        "ratios": ratios,
    }
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"generation-{stamp}.json").write_text(json.dumps(record, indent=1))
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
    lines += ["", *(f"- {k}: {v}x" for k, v in ratios.items() if v is not None)]
    (out / f"generation-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
