"""ONNX Runtime's own rates on the packed graphs (check.py's `_ort`, run in the serving
environment, which has numpy, onnxruntime and tokenizers): the compute limit the served rate is
compared with."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any


def rate(calls: Sequence[Callable[[], Any]], sizes: list[int], seconds: float) -> float:
    """Texts/s of running every batch in turn for `seconds`, after a first pass per shape
    (allocations, kernel choices) that is not counted."""
    for call in calls:
        call()
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for call, size in zip(calls, sizes):
            call()
            n += size
    return round(n / (time.perf_counter() - started), 1)


def tokenized_batches(
    texts: list[str], tokenizer: str, max_length: int, batch: int
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The texts tokenized ahead (their encodings, shortest first) and sorted by length into
    batches of `batch`, each padded to its longest."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    tok.no_padding()
    tok.enable_truncation(max_length)
    enc = sorted(tok.encode_batch(texts), key=lambda e: len(e.ids))
    batches = []
    for s in range(0, len(enc), batch):
        chunk = enc[s : s + batch]
        width = max(len(e.ids) for e in chunk)

        def pad(rows: list[list[int]], width: int = width) -> Any:
            return np.array([r + [0] * (width - len(r)) for r in rows], dtype=np.int64)

        batches.append(
            {
                "input_ids": pad([e.ids for e in chunk]),
                "attention_mask": pad([e.attention_mask for e in chunk]),
                "token_type_ids": pad([e.type_ids for e in chunk]),
            }
        )
    return enc, batches


def served_like(enc: list[Any], batch: int, budget: int, n: int = 400) -> list[dict[str, Any]]:
    """Batches as the serving core runs them: `n` dynamic batches of 1 to `batch` texts drawn at
    random (seeded), each sorted by length and cut into sub-batches of at most `budget` padded
    tokens (hf2triton.serving.text.plan_sub_batches), each padded to its longest: every shape
    the served path meets, most of them once."""
    import random

    import numpy as np

    rng = random.Random(0)
    out = []
    for _ in range(n):
        rows = sorted(
            rng.sample(enc, min(len(enc), rng.randint(1, batch))), key=lambda e: len(e.ids)
        )
        groups: list[list[Any]] = [[]]
        for e in rows:
            if groups[-1] and (len(groups[-1]) + 1) * len(e.ids) > budget:
                groups.append([])
            groups[-1].append(e)
        for g in groups:
            width = max(len(e.ids) for e in g)

            def pad(rows: list[list[int]], width: int = width) -> Any:
                return np.array([r + [0] * (width - len(r)) for r in rows], dtype=np.int64)

            out.append(
                {
                    "input_ids": pad([e.ids for e in g]),
                    "attention_mask": pad([e.attention_mask for e in g]),
                    "token_type_ids": pad([e.type_ids for e in g]),
                }
            )
    return out


def bucketed(feed: dict[str, Any], multiple: int = 32) -> dict[str, Any]:
    """One sub-batch padded to a bucket: its width up to a multiple of `multiple` tokens, its
    rows up to a power of two (the extra rows one unmasked token each): far fewer shapes."""
    import numpy as np

    rows, width = feed["input_ids"].shape
    new_rows, new_width = 1 << (rows - 1).bit_length(), -(-width // multiple) * multiple
    out = {}
    for k, v in feed.items():
        grown = np.zeros((new_rows, new_width), dtype=v.dtype)
        grown[:rows, :width] = v
        if k == "attention_mask":
            grown[rows:, 0] = 1  # a fully masked row can turn fp16 attention into NaN
        out[k] = grown
    return out


def one_pass(session: Any, feeds: list[dict[str, Any]]) -> float:
    """Texts/s of running each feed once (no warm-up: the shapes as they come)."""
    started = time.perf_counter()
    for f in feeds:
        session.run(None, f)
    return round(sum(len(f["input_ids"]) for f in feeds) / (time.perf_counter() - started), 1)


def graph_rates(
    graph: str,
    providers: list[Any],
    device: str,
    batches: list[dict[str, Any]],
    seconds: float,
    varied: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One graph's session: the provider it runs on, how long it took to open, and its texts/s
    with session.run and with IO binding."""
    import numpy as np
    import onnxruntime as ort

    half = Path(graph).with_name("weights16.bin")
    if half.is_file():  # pack.py's plain fp32 graph: its weights came as fp16
        np.fromfile(half, dtype=np.float16).astype(np.float32).tofile(half.with_name("weights.bin"))
    opened = time.monotonic()
    session = ort.InferenceSession(graph, providers=providers)
    row: dict[str, Any] = {
        "provider": session.get_providers()[0],
        "open_s": round(time.monotonic() - opened, 2),
    }
    names = [i.name for i in session.get_inputs()]
    feeds = [{k: b[k] for k in names} for b in batches]
    sizes = [len(b["input_ids"]) for b in batches]
    row["texts_per_s"] = rate([partial(session.run, None, f) for f in feeds], sizes, seconds)
    bound = []
    for f in feeds:
        binding = session.io_binding()
        for k, v in f.items():
            binding.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, device, 0))
        for o in session.get_outputs():
            binding.bind_output(o.name, device)
        bound.append(partial(session.run_with_iobinding, binding))
    row["io_binding_texts_per_s"] = rate(bound, sizes, seconds)
    if varied:  # the served path's shapes: first seen (cold), then seen again (warm)
        mixed = [{k: b[k] for k in names} for b in varied]
        row["served_like_cold_texts_per_s"] = one_pass(session, mixed)
        row["served_like_warm_texts_per_s"] = one_pass(session, mixed)
        row["served_like_shapes"] = len({b["input_ids"].shape for b in mixed})
        row["served_like_runs"] = len(mixed)
        buckets = [bucketed(f) for f in mixed]
        texts = sum(len(f["input_ids"]) for f in mixed)
        started = time.perf_counter()
        for f in buckets:
            session.run(None, f)
        row["served_like_bucketed_cold_texts_per_s"] = round(
            texts / (time.perf_counter() - started), 1
        )
        row["served_like_bucketed_shapes"] = len({b["input_ids"].shape for b in buckets})
    return row


def ort_main(args: argparse.Namespace) -> int:
    """ONNX Runtime's own rate on the graphs, in the serving environment: the texts tokenized
    ahead, sorted by length into batches of `batch`, each padded to its longest; texts/s with
    session.run (numpy in and out, as the serving core runs it) and with IO binding (inputs
    placed on the device ahead, outputs left there): the compute limit. Prints one JSON line."""
    import onnxruntime as ort

    texts = json.loads(Path(args.texts).read_text(encoding="utf-8"))
    enc, batches = tokenized_batches(texts, args.tokenizer, args.max_length, args.batch)
    cuda = args.provider == "cuda"
    providers: list[Any] = (
        [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
        if cuda
        else ["CPUExecutionProvider"]
    )
    device = "cuda" if cuda else "cpu"
    result: dict[str, Any] = {
        "available_providers": ort.get_available_providers(),
        "onnxruntime": ort.__version__,
        "batch": args.batch,
        "texts": len(texts),
        "tokens": {
            "max": max(len(e.ids) for e in enc),
            "mean": round(sum(len(e.ids) for e in enc) / len(enc), 1),
        },
        "graphs": {},
    }
    varied = served_like(enc, args.batch, args.max_batch_tokens) if args.max_batch_tokens else None
    for label, graph in (g.split("=", 1) for g in args.graph):
        result["graphs"][label] = graph_rates(
            graph, providers, device, batches, args.seconds, varied if label == "shipped" else None
        )
    print(json.dumps(result))
    return 0
