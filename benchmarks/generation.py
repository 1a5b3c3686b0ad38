"""Text generation: output tokens/s and time to first token (p50, p99) at 1, 8 and 32 concurrent
streams, on prompts of every length, for three ways of serving one causal LM in one run:
- in-flight: the serving core's Generator (what Triton's Python backend runs) with the release's
  default `text_generation.batching: in-flight`: requests join and leave the running batch
  between decode steps;
- request-level: the same Generator with `batching: request`: a batch runs until all its
  requests finish before the next ones join;
- pytorch: transformers `generate`, one request at a time (a lock), streaming through a
  streamer so the first token is timed when it exists.
Each concurrency level is a closed loop: N client threads, each sending its next prompt when its
last stream ended, greedy, `--max-new` tokens each (the model never ends a text early). The model
is the fp32 ONNX export of a random-weight Llama (hidden 512, 6 layers, 14M parameters; `--model
DIR` for another model directory). The served numbers are in-process (the decode loop and its
streams as Triton's Python backend runs them, without gRPC in front); the ratios are what this
compares.

    .venv/bin/python benchmarks/generation.py [--requests 64] [--max-new 128] [--threads 1]
        [--model DIR]

Writes benchmarks/results/generation-<UTC time>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LEVELS = (1, 8, 32)


def prompts_of_every_length(n: int) -> list[str]:
    """Prompts from 1 to about 120 words, drawn from the validation corpus."""
    from tests.tiny_models import CORPUS

    lines = list(dict.fromkeys(CORPUS))
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        words = " ".join(lines[(i + k) % len(lines)] for k in range(1 + i % 12)).split()
        out.append(" ".join(words[: max(1, int(rng.integers(1, 1 + len(words))))]))
    return out


def export(model_dir: Path, out: Path, max_new: int) -> dict:
    """The fp32 export and the serving.json the release would write for it."""
    from hf2triton.export import optimum_export
    from hf2triton.kinds.base import save_fast_tokenizer
    from hf2triton.kinds.text_generation import (
        TextGenerationKind,
        TextGenerationSpec,
        resolve_text_generation,
    )

    optimum_export(str(model_dir), out, "text-generation-with-past", 17, "model.onnx")
    save_fast_tokenizer(str(model_dir), out)
    cfg = resolve_text_generation(model_dir, TextGenerationSpec(max_new_tokens=max_new))
    kind = TextGenerationKind.__new__(TextGenerationKind)
    return {**kind.serving_json(cfg, str(out)), "onnx": str(out / "model.onnx"),
            "tokenizer_file": str(out / "tokenizer.json")}


class Served:
    """The serving core's Generator driven as Triton drives it: one stream per request."""

    def __init__(self, settings: dict, batching: str):
        from hf2triton import serving

        self.model = serving.load("", {**settings, "batching": batching, "max_rows": 32})

    def stream(self, prompt: str) -> tuple[float, int]:
        """(seconds to the first piece, tokens generated) of one greedy stream."""
        from hf2triton.serving import causal

        row = self.model.parse({"text_input": np.array([[prompt.encode()]], dtype=object),
                                "stream": np.array([[True]])})[0]
        first: list[float] = []
        done = threading.Event()
        started = time.perf_counter()

        def emit(text, ids, last, seq):
            if ids and not first:
                first.append(time.perf_counter() - started)
            if last:
                done.set()

        seq = causal.Sequence(prompt=row["ids"], sampling=row["sampling"], emit=emit,
                              stream=True)
        self.model.engine.submit([seq])
        done.wait()
        return (first[0] if first else time.perf_counter() - started), len(seq.generated)

    def close(self) -> None:
        self.model.close()


class Torch:
    """transformers `generate`, one request at a time."""

    def __init__(self, model_dir: Path, max_new: int):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.generation.streamers import BaseStreamer

        self.torch, self.max_new = torch, max_new
        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
        self.lock = threading.Lock()
        self.Base = BaseStreamer

    def stream(self, prompt: str) -> tuple[float, int]:
        first: list[float] = []
        started = time.perf_counter()

        class Timer(self.Base):
            calls = 0

            def put(self, value):
                Timer.calls += 1
                if Timer.calls == 2 and not first:  # the first call is the prompt
                    first.append(time.perf_counter() - started)

            def end(self):
                pass

        ids = self.tok(prompt, return_tensors="pt")["input_ids"]
        with self.lock, self.torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=self.torch.ones_like(ids),
                                      do_sample=False, max_new_tokens=self.max_new,
                                      streamer=Timer())
        return first[0], int(out.shape[1] - ids.shape[1])

    def close(self) -> None:
        pass


def closed_loop(way, prompts: list[str], clients: int) -> dict:
    """`clients` threads share `prompts`, each sending the next when its last stream ended."""
    lock = threading.Lock()
    queue = list(prompts)
    ttft: list[float] = []
    tokens = [0]

    def client():
        while True:
            with lock:
                if not queue:
                    return
                prompt = queue.pop()
            first, n = way.stream(prompt)
            with lock:
                ttft.append(first)
                tokens[0] += n

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    return {"tokens_per_s": round(tokens[0] / seconds, 1),
            "ttft_p50_ms": round(float(np.percentile(ttft, 50)) * 1000, 1),
            "ttft_p99_ms": round(float(np.percentile(ttft, 99)) * 1000, 1),
            "requests": len(ttft), "tokens": tokens[0], "seconds": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64, help="requests per level")
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=512, help="the random Llama's width")
    parser.add_argument("--layers", type=int, default=6, help="the random Llama's layers")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime's and PyTorch's "
                        "threads (1: steady figures on a shared machine)")
    parser.add_argument("--model", type=Path, help="a causal LM directory (default: random "
                        "Llama, hidden 256, 4 layers)")
    args = parser.parse_args()
    from hf2triton.cpu import cpu_features
    from tests.tiny_models import build_tiny_llama

    work = Path(tempfile.mkdtemp(prefix="generation-bench-"))
    model_dir = args.model or build_tiny_llama(work / "llama", hidden=args.hidden,
                                               layers=args.layers, max_positions=512,
                                               eos_boost=0.0)
    import torch

    torch.set_num_threads(args.threads)
    settings = {**export(model_dir, work / "onnx", args.max_new),
                "intra_op_threads": args.threads}
    prompts = prompts_of_every_length(args.requests)
    ways = {"in-flight": Served(settings, "in-flight"),
            "request-level": Served(settings, "request"),
            "pytorch": Torch(model_dir, args.max_new)}
    results: dict = {name: {} for name in ways}
    for way in ways.values():
        way.stream(prompts[0])  # warm
    # Level by level, the three ways one after the other: each ratio is of figures taken
    # minutes apart at most, on a machine others may share.
    for c in LEVELS:
        for name, way in ways.items():
            results[name][str(c)] = closed_loop(way, prompts, c)
            print(name, c, json.dumps(results[name][str(c)]), flush=True)
    for way in ways.values():
        way.close()
    ratios = {
        "in-flight_32_over_1": round(results["in-flight"]["32"]["tokens_per_s"]
                                     / results["in-flight"]["1"]["tokens_per_s"], 2),
        **{f"in-flight_over_{other}_at_{c}": round(
            results["in-flight"][str(c)]["tokens_per_s"]
            / results[other][str(c)]["tokens_per_s"], 2)
           for other in ("request-level", "pytorch") for c in LEVELS},
    }
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    record = {"when": stamp, "machine": platform.processor() or platform.machine(),
              "cpu": cpu_features(), "model": str(args.model or f"random Llama h{args.hidden} l{args.layers}"),
              "max_new_tokens": args.max_new, "requests_per_level": args.requests,
              "threads": args.threads,
              "results": results, "ratios": ratios}
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"generation-{stamp}.json").write_text(json.dumps(record, indent=1))
    lines = ["| way | streams | output tokens/s | TTFT p50 ms | TTFT p99 ms |",
             "|---|---|---|---|---|"]
    for name, levels in results.items():
        for c, r in levels.items():
            lines.append(f"| {name} | {c} | {r['tokens_per_s']} | {r['ttft_p50_ms']} | "
                         f"{r['ttft_p99_ms']} |")
    lines += ["", *(f"- {k}: {v}x" for k, v in ratios.items())]
    (out / f"generation-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
