"""serving.py's measurements: the in-process limit of the shipped model's serving core, the
served points (closed-loop clients against Triton), and the key ratio measured in alternation."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from harness import MODEL, log
from load import TritonGrpc, TritonHttp, run_point

IN_PROCESS = (  # name, token budget (None: the served model's), texts run together
    ("sorted_32", None, 32),  # a dynamic batch of 32 sorted into sub-batches (the limit)
    ("sorted_64", None, 64),  # the largest dynamic batch at 64 clients
    ("sorted_512", None, 512),  # 512 texts at once: more than any server sees together
    ("padded_32", 0, 32),  # a dynamic batch of 32 run as one padded batch: no token budget
)


def in_process(version_dir: Path, texts: list[str], seconds: float) -> dict[str, dict]:
    """Texts/s of the served model's own serving core (same files, same settings) with nothing
    between client and model: texts in arrival order, taken `n` at a time, sorted by length into
    token-bounded sub-batches; and for scale, 32 at a time as one padded batch."""
    from hf2triton import serving

    settings = serving.read_settings(str(version_dir))
    out = {}
    for name, budget, batch in IN_PROCESS:
        budget = settings.get("max_batch_tokens", 0) if budget is None else budget
        model = serving.load(str(version_dir), {**settings, "max_batch_tokens": budget})
        model.embed(texts[:batch])
        done, started, i = 0, time.perf_counter(), 0
        while time.perf_counter() - started < seconds:
            chunk = texts[i : i + batch] or texts[:batch]
            model.embed(chunk)
            done += len(chunk)
            i = (i + batch) % len(texts)
        rate = done / (time.perf_counter() - started)
        out[name] = {
            "texts_per_s": round(rate, 1),
            "max_batch_tokens": budget,
            "texts_per_run": batch,
        }
        log(f"  in-process {name} (budget {budget or 'none'}): {rate:.0f} texts/s")
    return out


def point(
    make, texts: list[str], clients: int, seconds: float, pid: int | None, label: str
) -> dict:
    r = run_point(make, texts, clients, seconds, min(4.0, seconds / 2), 10**9, pid, label)
    log(
        f"  {label} @{clients}: {r.rps:.1f} req/s, p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms"
        f"{f', {r.errors} errors' if r.errors else ''}"
    )
    return {"clients": clients, **r.to_dict()}


def served_points(
    grpc_url: str,
    http_url: str | None,
    mixes: dict[str, list[str]],
    clients: dict[str, list[int]],
    seconds: float,
    pid: int | None,
    label: str,
) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for mix, texts in mixes.items():
        rows = [
            point(
                lambda n: TritonGrpc(grpc_url, MODEL), texts, c, seconds, pid, f"{label} {mix} grpc"
            )
            for c in clients[mix]
        ]
        if http_url:
            rows.append(
                {
                    **point(
                        lambda n: TritonHttp(http_url, MODEL),
                        texts,
                        64,
                        seconds,
                        pid,
                        f"{label} {mix} http",
                    ),
                    "protocol": "http",
                }
            )
        out[mix] = rows
    return out


def at(rows: list[dict], clients: int, protocol: str = "grpc") -> dict:
    """The row measured at `clients` clients over `protocol` (a run measures every level)."""
    found = next(
        (r for r in rows if r["clients"] == clients and r.get("protocol", "grpc") == protocol), None
    )
    assert found is not None, f"no figures at {clients} clients over {protocol}"
    return found


def paired(
    version_dir: Path,
    grpc_url: str,
    texts: list[str],
    seconds: float,
    pid: int | None,
    rounds: int = 3,
) -> dict:
    """The key ratio measured in alternation, so that a machine that speeds up or slows down
    between minutes moves both sides: each round the in-process rate (32 and 64 at a time),
    then served@64 on the same traffic; the median of the rounds' ratios."""
    rows = []
    for i in range(rounds):
        limit = {
            k: v
            for k, v in in_process(version_dir, texts, seconds / 2).items()
            if k in ("sorted_32", "sorted_64")
        }
        served = point(
            lambda n: TritonGrpc(grpc_url, MODEL), texts, 64, seconds, pid, f"paired round {i + 1}"
        )
        rows.append(
            {
                "served_rps": served["rps"],
                "p99_ms": served["p99_ms"],
                **{f"{k}_texts_per_s": v["texts_per_s"] for k, v in limit.items()},
                **{f"over_{k}": served["rps"] / v["texts_per_s"] for k, v in limit.items()},
            }
        )
    return {
        "rounds": rows,
        **{
            f"median_over_{k}": float(np.median([r[f"over_{k}"] for r in rows]))
            for k in ("sorted_32", "sorted_64")
        },
    }
