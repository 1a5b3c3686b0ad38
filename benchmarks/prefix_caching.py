"""Prefix caching on OpenVINO GenAI, served: the same model released twice on one Triton, with
`text_generation.prefix_caching` on and off, asked by closed-loop clients over the
OpenAI-compatible `/v1/chat/completions` stream with two kinds of chat traffic:

- shared: every request starts with the same system prompt of about 400 tokens (an assistant's
  instructions), then a short question of its own;
- unshared: every request's system prompt is another 400-token passage, then its question.

Time to first token p50/p99 and tokens/s at each level, each traffic on each release one after
the other in one run. The model is the text-generation benchmark's Qwen2 of about 25M parameters
(random weights, context 2048 here so the system prompt fits).

    .venv/bin/python benchmarks/prefix_caching.py [--levels 1,8] [--max-new 32]

Writes benchmarks/results/prefix-caching-<UTC time>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generation import ROOT, release  # noqa: E402
from generation_streams import chat_stream_stamps, closed_loop  # noqa: E402


def passage(words: list[str], rng: np.random.Generator, n: int) -> str:
    start = int(rng.integers(0, len(words) - n))
    return " ".join(words[start : start + n])


def chats(n: int, shared: bool, seed: int) -> list[list[dict[str, str]]]:
    """`n` chats: a system prompt of about 400 tokens (one for all, or one each) and a question."""
    text = (ROOT / "releases" / "data" / "kjv-pentateuch.txt").read_text(encoding="utf-8")
    words = [w for line in text.splitlines() if not line.startswith("#") for w in line.split()]
    rng = np.random.default_rng(seed)
    system = passage(words, rng, 300)
    return [
        [
            {"role": "system", "content": system if shared else passage(words, rng, 300)},
            {"role": "user", "content": passage(words, rng, int(rng.integers(5, 20)))},
        ]
        for _ in range(n)
    ]


async def run(url: str, model: str, traffic: list, streams: int, max_new: int) -> dict:
    import aiohttp

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=900)
    ) as session:

        async def one(messages: Any) -> list[float]:
            return await chat_stream_stamps(session, url, model, messages, max_new)

        return await closed_loop(one, traffic, streams)


def measured(url: str, levels: list[int], max_new: int) -> dict[str, dict[str, Any]]:
    """At each level, shared and unshared system prompts, each against both releases."""
    results: dict[str, dict[str, Any]] = {}
    for c in levels:
        for shared in (True, False):
            traffic = chats(4 * c + 4, shared, seed=c)
            for name in ("with", "without"):
                way = f"{'shared' if shared else 'unshared'} prompt, prefix caching {name}"
                found = asyncio.run(run(url, f"prefix-{name}", traffic, c, max_new))
                results.setdefault(way, {})[str(c)] = found
                print(way, c, json.dumps(found), flush=True)
    return results


def write_record(levels: list[int], max_new: int, results: dict[str, dict[str, Any]]) -> None:
    """benchmarks/results/prefix-caching-<UTC time>.json and .md; the table printed."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "when": stamp,
        "commit": commit,
        "levels": levels,
        "max_new_tokens": max_new,
        "results": results,
    }
    (out / f"prefix-caching-{stamp}.json").write_text(json.dumps(record, indent=1))
    lines = [
        "| traffic, release | streams | tokens/s | TTFT p50 ms | TTFT p99 ms |",
        "|---|---|---|---|---|",
    ]
    for way, per in results.items():
        for level, r in per.items():
            figures = f"{r['tokens_per_s']} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']}"
            lines.append(f"| {way} | {level} | {figures} |")
    (out / f"prefix-caching-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--levels", default="1,8")
    parser.add_argument("--max-new", type=int, default=32)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    from hf2triton.targets import triton_local
    from hf2triton.util.net import free_port
    from tests.tiny_models import build_qwen2

    work = Path(tempfile.mkdtemp(prefix="prefix-bench-"))
    model_dir = build_qwen2(work / "qwen2-25m", vocab_size=1500, max_positions=2048)
    home = work / "home"
    ports: dict[str, Any] = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    fp32 = [{"name": "openvino-genai", "precision": "fp32"}]
    for name, on in (("with", True), ("without", False)):
        release(
            model_dir,
            f"prefix-{name}",
            home,
            ports,
            args.max_new,
            max(levels),
            fp32,
            prefix_caching=on,
            max_context=2048,
        )
    url = f"http://127.0.0.1:{ports['openai']['port']}/v1/chat/completions"
    try:
        results = measured(url, levels, args.max_new)
    finally:
        os.environ["HF2TRITON_HOME"] = str(home)
        triton_local.stop_server()
    write_record(levels, args.max_new, results)


if __name__ == "__main__":
    main()
