"""ONNX Runtime's own rates on the packed graphs (check.py's `_ort`, run in the serving
environment, which has numpy, onnxruntime and tokenizers): the compute limit the served rate is
compared with."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


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


def padded(encodings: list[Any], shape: tuple[int, int] | None = None) -> dict[str, Any]:
    """A sub-batch's token ids, mask and types padded to `shape` (rows, width; default its own
    rows and longest); the rows beyond its own hold one unmasked token, as the serving core's."""
    import numpy as np

    rows, width = shape or (len(encodings), max(len(e.ids) for e in encodings))
    out = {k: np.zeros((rows, width), dtype=np.int64) for k in INPUTS}
    out["attention_mask"][len(encodings) :, 0] = 1
    for row, e in enumerate(encodings):
        for name, values in zip(INPUTS, (e.ids, e.attention_mask, e.type_ids)):
            out[name][row, : len(values)] = values
    return out


def tokenized_batches(
    texts: list[str], tokenizer: str, max_length: int, batch: int
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The texts tokenized ahead (their encodings, shortest first) and sorted by length into
    batches of `batch`, each padded to its longest."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    tok.no_padding()
    tok.enable_truncation(max_length)
    enc = sorted(tok.encode_batch(texts), key=lambda e: len(e.ids))
    batches = [padded(enc[s : s + batch]) for s in range(0, len(enc), batch)]
    return enc, batches


def served_like(
    enc: list[Any], batch: int, budget: int, max_length: int, n: int = 400
) -> dict[str, list[dict[str, Any]]]:
    """Batches as the serving core runs them: `n` dynamic batches of 1 to `batch` texts drawn at
    random (seeded), cut into sub-batches by the served code's own plan (its token budget), each
    padded to its longest ("plain": every shape the served path meets, most of them once) and to
    the CUDA runtime's buckets ("bucketed", its default pad_to)."""
    import random

    from hf2triton_serving.runtimes.onnxruntime_cuda import OnnxRuntimeCuda  # type: ignore[import-not-found]
    from hf2triton_serving.text import bucket_shape, plan_sub_batches  # type: ignore[import-not-found]

    pad_to = OnnxRuntimeCuda.options["pad_to"]

    rng = random.Random(0)
    out: dict[str, list[dict[str, Any]]] = {"plain": [], "bucketed": []}
    for _ in range(n):
        rows = rng.sample(enc, min(len(enc), rng.randint(1, batch)))
        for group in plan_sub_batches([len(e.ids) for e in rows], budget):
            sub = [rows[i] for i in group]
            longest = max(len(e.ids) for e in sub)
            out["plain"].append(padded(sub))
            out["bucketed"].append(padded(sub, bucket_shape(len(sub), longest, pad_to, max_length)))
    return out


def one_pass(session: Any, feeds: list[dict[str, Any]], texts: int) -> float:
    """Texts/s of running each feed once (no warm-up: the shapes as they come)."""
    started = time.perf_counter()
    for f in feeds:
        session.run(None, f)
    return round(texts / (time.perf_counter() - started), 1)


def graph_rates(
    graph: str,
    providers: list[Any],
    device: str,
    batches: list[dict[str, Any]],
    seconds: float,
    varied: dict[str, list[dict[str, Any]]] | None = None,
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
        plain, buckets = ([{k: b[k] for k in names} for b in varied[key]] for key in varied)
        texts = sum(len(b["input_ids"]) for b in plain)
        row["served_like_cold_texts_per_s"] = one_pass(session, plain, texts)
        row["served_like_warm_texts_per_s"] = one_pass(session, plain, texts)
        row["served_like_shapes"] = len({b["input_ids"].shape for b in plain})
        row["served_like_runs"] = len(plain)
        row["served_like_bucketed_cold_texts_per_s"] = one_pass(session, buckets, texts)
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
    sys.path.insert(0, args.serving_core)  # the rendered version's own serving code
    varied = served_like(enc, args.batch, args.max_batch_tokens, args.max_length)
    for label, graph in (g.split("=", 1) for g in args.graph):
        result["graphs"][label] = graph_rates(
            graph, providers, device, batches, args.seconds, varied if label == "shipped" else None
        )
    print(json.dumps(result))
    return 0
