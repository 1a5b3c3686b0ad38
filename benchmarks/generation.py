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
        [--max-perplexity-increase X] [--llama-cpp SRC] [--weights f32|int8]
        [--objective throughput|latency]

`--objective latency` releases with `runtime.objective: latency` and `runtime.candidates: auto`
(OpenVINO GenAI's own list, with the latency objective's settings: activations quantized in
groups of 32 beside compressed weights), timed at one stream and searched as a user's release
is (pruned, fastest first, the first that passes ships; otherwise every candidate is judged).

Writes benchmarks/results/generation-<UTC time>.{json,md}. The ways measured are in
generation_ways.py, the prompts and the closed loop in generation_streams.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from generation_streams import traffic  # noqa: E402
from generation_ways import InProcess, LlamaServer, Served, Torch  # noqa: E402

REQUESTS = {1: 6, 8: 32, 32: 96, 64: 160}  # per level: a few rounds of every stream


def release_spec(
    model_dir: Path,
    name: str,
    home: Path,
    ports: dict,
    max_new: int,
    rows: int,
    candidates: Any,
    quantization: str = "none",
    objective: str = "throughput",
    **generation: Any,
) -> Path:
    """The spec releasing `model_dir` as `name` (validated on 24 prompts written beside it),
    its weights compressed as `quantization` says (none: as exported)."""
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
        runtime__objective=objective,
        quantization__method=quantization,
        # with compressed weights the gate times the candidates and ships the fastest that passes
        quantization__search=quantization != "none",
        validation__sentences=str(prompts),
        validation__smoke_sentences=4,
        validation__judge_all=objective != "latency",  # latency: the search as users get it
        deploy__max_batch_size=rows,
        deploy__preferred_batch_sizes=[rows],
        **{f"deploy__{k}": v for k, v in ports.items()},
    )
    data = yaml.safe_load(spec.read_text())
    data.pop("watch", None)
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


def release(
    model_dir: Path,
    name: str,
    home: Path,
    ports: dict,
    max_new: int,
    rows: int,
    candidates: Any,
    quantization: str = "none",
    objective: str = "throughput",
    **generation: Any,
) -> dict:
    """Release `model_dir` as `name` on OpenVINO GenAI (`candidates`: the runtime's own auto
    list, or one precision), in a child process (its own Prefect, MLflow and the local Triton
    it leaves running)."""
    spec = release_spec(
        model_dir, name, home, ports, max_new, rows, candidates, quantization, objective,
        **generation,
    )  # fmt: skip
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


def arguments() -> argparse.Namespace:
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
        "--max-perplexity-increase",
        type=float,
        help="the gate's limit (default 0.05): a random model's int8 weights miss it (0.089 on "
        "SmolLM2-135M's shape), so measuring their speed needs a higher one",
    )
    parser.add_argument(
        "--llama-cpp", type=Path, help="a llama.cpp source tree with build/bin/llama-server"
    )
    parser.add_argument(
        "--weights",
        default="f32",
        choices=("f32", "int8"),
        help="int8: the IR's weights compressed to int8 by NNCF (the gate judges them beside "
        "the f32 weights and the fastest that passes ships), llama.cpp on a Q8_0 GGUF",
    )
    parser.add_argument(
        "--objective",
        default="throughput",
        choices=("throughput", "latency"),
        help="latency: runtime.objective latency and runtime.candidates auto (the latency "
        "objective's own candidates too)",
    )
    return parser.parse_args()


def released(
    args: argparse.Namespace, model_dir: Path, home: Path, ports: dict, levels: list[int]
) -> dict:
    """The model released as bench-genai: the candidates asked for, the gate's limit if given."""
    candidates: Any = (
        [{"name": "openvino-genai", "precision": p} for p in ("fp32", "bf16")]
        if args.candidates == "auto"
        else [{"name": "openvino-genai", "precision": args.candidates}]
    )
    if args.objective == "latency":
        candidates = "auto"
    thresholds = {
        "min_next_token_agreement": args.min_next_token_agreement,
        "max_perplexity_increase": args.max_perplexity_increase,
    }
    thresholds = {k: v for k, v in thresholds.items() if v is not None}
    limits = {"thresholds": thresholds} if thresholds else {}
    quantization = "int8-blockwise" if args.weights == "int8" else "none"
    return release(
        model_dir,
        "bench-genai",
        home,
        ports,
        args.max_new,
        max(levels),
        candidates,
        quantization,
        objective=args.objective,
        **limits,
    )


def measured(ways: dict[str, Any], levels: list[int], limit: InProcess) -> dict[str, dict]:
    """Every way warmed, then level by level every way on the same prompts."""
    results: dict[str, dict[str, Any]] = {name: {} for name in ways}
    for way in ways.values():  # warm
        way.run(traffic(limit.tokenizer, 2, seed=9), 1)
    for c in levels:
        prompts = traffic(limit.tokenizer, REQUESTS.get(c, 3 * c), seed=c)
        for name, way in ways.items():
            results[name][str(c)] = way.run(prompts, c)
            print(name, c, json.dumps(results[name][str(c)]), flush=True)
    return results


def write_record(
    args: argparse.Namespace,
    levels: list[int],
    summary: dict,
    limit: InProcess,
    results: dict[str, dict[str, Any]],
) -> None:
    """benchmarks/results/generation-<UTC time>.json and .md; the table printed."""
    from hf2triton.util.cpu import cpu_features

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


def main() -> None:
    args = arguments()
    levels = [int(x) for x in args.levels.split(",")]
    from hf2triton.targets import triton_local
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
    summary = released(args, model_dir, home, ports, levels)
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
        # llama.cpp at the weights that serve: Q8_0 for int8 weights, else the compute precision
        weights = "int8" if "/int8" in summary["variant"] else limit.precision
        ways["llama.cpp"] = LlamaServer(args.llama_cpp, model_dir, work, weights, args.max_new)
    try:
        results = measured(ways, levels, limit)
    finally:
        os.environ["HF2TRITON_HOME"] = str(home)
        triton_local.stop_server()
    write_record(args, levels, summary, limit, results)


if __name__ == "__main__":
    main()
