"""What the text-generation benchmarks (generation.py, prefix_caching.py) share: prompts of every
length cut from the shipped text, the closed loop of streams and its figures (tokens/s, time to
first token, time between tokens), and the OpenAI chat stream's timer."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
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
