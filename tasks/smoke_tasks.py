"""Smoke step for text-classification and translation releases: query the deployed version over
gRPC and HTTP, one text per request and as batches, and compare what it serves with what
validation recorded: the shipped candidate's own answers (must match: serving runs what was
validated) and the PyTorch model's (served labels equal PyTorch's; served greedy translations
score the release's BLEU/chrF gate against PyTorch `generate`, and equal it for an fp32 release
whose in-process output did)."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from hf2triton.errors import ServiceUnavailableError, SmokeTestError


def _module(protocol: str):
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    return module


def _wait_ready(client: Any, url: str, protocol: str, model: str, version: str,
                timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if client.is_model_ready(model, version):
                return
        except Exception:  # not up yet: tritonclient raises several types while connecting
            pass
        if time.monotonic() > deadline:
            raise ServiceUnavailableError(
                f"{model} version {version} is not ready on {url} ({protocol}) after "
                f"{timeout_s:.0f}s")
        time.sleep(0.5)


def _inputs(module, texts: list[str], **ints: int | None) -> list:
    data = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
    inp = module.InferInput("TEXT", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    out = [inp]
    for name, value in ints.items():
        if value is not None:
            arr = np.full((len(texts), 1), value, dtype=np.int32)
            x = module.InferInput(name, list(arr.shape), "INT32")
            x.set_data_from_numpy(arr)
            out.append(x)
    return out


def query(protocol: str, url: str, model: str, version: str, texts: list[str], output: str,
          batch: int = 1, **ints: int | None) -> tuple[list[Any], list[float]]:
    """Send `texts` in requests of `batch` texts; returns the output rows and latencies (ms)."""
    module = _module(protocol)
    client = module.InferenceServerClient(url=url)
    _wait_ready(client, url, protocol, model, version)
    rows, latency = [], []
    for i in range(0, len(texts), batch):
        started = time.perf_counter()
        res = client.infer(model, _inputs(module, texts[i:i + batch], **ints),
                           model_version=version)
        latency.append((time.perf_counter() - started) * 1000)
        rows.extend(res.as_numpy(output))
    client.close()
    return rows, latency


def _text(row: Any) -> str:
    value = row[0] if isinstance(row, np.ndarray) else row
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def smoke_classifier(grpc_url: str, http_url: str, model: str, version: str, ref: dict,
                     max_batch_size: int) -> dict[str, float]:
    texts = ref["texts"]
    expected = np.array(ref["pytorch_probs"], dtype=np.float32)
    shipped = np.array(ref["candidate_probs"], dtype=np.float32)
    labels = ref["labels"]
    want = [labels[i] for i in expected.argmax(axis=1)] if ref["activation"] == "softmax" else \
        [",".join(labels[j] for j in np.flatnonzero(p > 0.5)) for p in expected]
    results, lat = {}, {}
    for name, protocol, url, batch in (("grpc", "grpc", grpc_url, 1), ("http", "http", http_url, 1),
                                       ("batch", "grpc", grpc_url, max_batch_size)):
        scores, lat[name] = query(protocol, url, model, version, texts, "SCORES", batch)
        got_labels, _ = query(protocol, url, model, version, texts, "LABEL", batch)
        results[name] = (np.stack(scores), [_text(x) for x in got_labels])
    out: dict[str, float] = {"sentences": len(texts)}
    for name, (scores, got) in results.items():
        wrong = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
        if wrong:
            i = wrong[0]
            raise SmokeTestError(
                f"{model} version {version} serves label {got[i]!r} for {texts[i][:40]!r} "
                f"({name}) where PyTorch says {want[i]!r} ({len(wrong)} of {len(texts)} texts "
                "differ); champion was not moved")
        drift = float(np.abs(scores - shipped).max())
        if not drift <= 1e-3:
            raise SmokeTestError(
                f"{model} version {version} ({name}) serves scores that differ by {drift:.2e} "
                "from the validated model's: it does not serve what was validated; champion "
                "was not moved")
        out[f"{name}_label_agreement"] = 1.0
        out[f"{name}_max_prob_diff"] = float(np.abs(scores - expected).max())
    out["grpc_p50_ms"] = float(np.median(lat["grpc"]))
    out["http_p50_ms"] = float(np.median(lat["http"]))
    return out


def smoke_translator(grpc_url: str, http_url: str, model: str, version: str, ref: dict,
                     max_batch_size: int) -> dict[str, float]:
    from hf2triton.translation import bleu_chrf

    texts = ref["texts"]
    checks = [
        # name, protocol, url, texts per request, NUM_BEAMS, what the validated model said
        ("grpc_greedy", "grpc", grpc_url, 1, 1, ref["candidate_greedy"]),
        ("http_greedy", "http", http_url, 1, 1, ref["candidate_greedy"]),
        ("batch_greedy", "grpc", grpc_url, max_batch_size, 1, ref["candidate_greedy"]),
        ("batch_default", "grpc", grpc_url, max_batch_size, None, ref["candidate_default"]),
    ]
    out: dict[str, float] = {"sentences": len(texts)}
    for name, protocol, url, batch, beams, expected in checks:
        rows, latency = query(protocol, url, model, version, texts, "TRANSLATION", batch,
                              NUM_BEAMS=beams)
        got = [_text(r) for r in rows]
        wrong = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
        if wrong:
            i = wrong[0]
            raise SmokeTestError(
                f"{model} version {version} ({name}) translates {texts[i][:40]!r} as "
                f"{got[i][:60]!r} where the validated model said {expected[i][:60]!r} "
                f"({len(wrong)} of {len(texts)} differ); champion was not moved")
        if name.endswith("greedy") and batch == 1:
            out[f"{name.split('_')[0]}_p50_ms"] = float(np.median(latency))
    bleu, chrf = bleu_chrf(ref["candidate_greedy"], ref["pytorch_greedy"])
    same = sum(a == b for a, b in zip(ref["candidate_greedy"], ref["pytorch_greedy"]))
    out.update(greedy_bleu=bleu, greedy_chrf=chrf, greedy_exact_match=same / len(texts))
    t = ref["thresholds"]
    if not (bleu >= t["min_bleu"] and chrf >= t["min_chrf"]):
        raise SmokeTestError(
            f"served greedy translations of {model} version {version} score BLEU {bleu:.2f} / "
            f"chrF {chrf:.2f} against PyTorch generate, below the gate ({t['min_bleu']} / "
            f"{t['min_chrf']}); champion was not moved")
    return out


def smoke_task(grpc_url: str, http_url: str, model_name: str, version: str,
               reference_path: str, max_batch_size: int) -> dict[str, float]:
    """The smoke test of a release whose validation wrote a JSON reference."""
    with open(reference_path, encoding="utf-8") as f:
        ref = json.load(f)
    from tritonclient.utils import InferenceServerException

    run = smoke_translator if ref["task"] == "translation" else smoke_classifier
    try:
        return run(grpc_url, http_url, model_name, version, ref, max_batch_size)
    except InferenceServerException as exc:
        raise SmokeTestError(
            f"{model_name} version {version} failed a smoke request: {exc}") from None
