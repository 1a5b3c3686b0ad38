"""The GPU check's JSON object: filled stage by stage (a failed stage recorded, the rest going
on), issue 37's goals judged from it, and the logs copied under $OUT."""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpu.check_kit import Refused, log

GOALS = {
    # issue 37: what a GPU release should reach on one H100
    "served_share_of_ort_limit": 0.5,  # served texts/s at 128 clients / ORT's batch-64 limit
    "gpu_busy": 0.8,  # NVML utilisation during that load
    "fp16_vs_fp32": 2.0,  # the shipped fp16 graph's compute against the plain fp32 graph's
    "min_cosine": 0.9999,  # served embeddings against PyTorch's, the worst text
}


class Report:
    """The JSON object the check prints, filled stage by stage: a stage that fails records its
    error and the check goes on with what does not depend on it."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {"ok": True, "errors": [], "stage_seconds": {}}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        log(f"{name} ...")
        try:
            yield
        except Refused:
            raise
        except Exception as exc:
            self.data["ok"] = False
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            self.data["errors"].append({"stage": name, "error": detail[-3000:]})
            log(f"{name} failed: {detail[-600:]}")
        finally:
            self.data["stage_seconds"][name] = round(time.monotonic() - started, 1)


def goals(data: dict[str, Any], simulate: bool) -> dict[str, Any]:
    """Issue 37's goals against what was measured; on a CPU (simulate) none is judged."""
    served = [
        s
        for s in data.get("served", [])
        if s["instances"] == data.get("instance_count") and not s.get("variant")
    ]
    top = max(served, key=lambda s: s["clients"], default=None)
    graphs = (data.get("ort") or {}).get("graphs", {})
    shipped, plain = graphs.get("shipped"), graphs.get("plain_fp32")
    values = {
        "served_share_of_ort_limit": top["texts_per_s"] / shipped["texts_per_s"]
        if top and shipped
        else None,
        "gpu_busy": (top.get("gpu_busy") or {}).get("mean") if top else None,
        "fp16_vs_fp32": shipped["texts_per_s"] / plain["texts_per_s"]
        if shipped and plain
        else None,
        "min_cosine": (data.get("cosine") or {}).get("min"),
    }
    out = {}
    for name, target in GOALS.items():
        value = values[name]
        out[name] = {
            "value": None if value is None else round(value, 4),
            "target": target,
            "met": None if simulate or value is None else value >= target,
        }
    if top and shipped:
        out["served_share_of_ort_limit"]["of_io_binding_limit"] = round(
            top["texts_per_s"] / shipped["io_binding_texts_per_s"], 4
        )
        out["served_share_of_ort_limit"]["at_clients"] = top["clients"]
    out["instance_count"] = instance_sweep(data, simulate)
    if shipped and plain:
        out["fp16_vs_fp32"]["io_binding"] = round(
            shipped["io_binding_texts_per_s"] / plain["io_binding_texts_per_s"], 3
        )
    return out


def instance_sweep(data: dict[str, Any], simulate: bool) -> dict[str, Any]:
    """Which instance count served most at the most clients, against the rendered one: met when
    the rendered count serves within 5 % of the best (the load points' own noise)."""
    top_clients = max((s["clients"] for s in data.get("served", [])), default=None)
    rates = {
        s["instances"]: s["texts_per_s"]
        for s in data.get("served", [])
        if s["clients"] == top_clients and not s.get("variant")
    }
    rendered = data.get("instance_count")
    if not rates or rendered not in rates:
        return {"value": None, "target": "best", "met": None}
    best = max(rates, key=rates.__getitem__)
    share = rates[rendered] / rates[best] if rates[best] else 0.0
    return {
        "value": rendered,
        "target": "best",
        "best": best,
        "texts_per_s": {str(k): rates[k] for k in sorted(rates)},
        "at_clients": top_clients,
        "rendered_share_of_best": round(share, 3),
        "met": None if simulate else share >= 0.95,
    }


def save_out(path: Path) -> None:
    """A copy under $OUT (what the device tool brings back), the last MB of a log."""
    out = os.environ.get("OUT")
    if out and path.is_file():
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 1_000_000))
            Path(out, path.name).write_bytes(f.read())
