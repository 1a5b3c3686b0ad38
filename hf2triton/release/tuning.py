"""Triton configuration search: dynamic-batching and execution settings measured against a
served endpoint.

Every combination in `deploy.tuning` (preferred batch sizes x queue delay x (instances,
intra-op threads)) is rendered by the repository builder itself, loaded into a private
tritonserver on free loopback ports, and driven by closed-loop gRPC clients sending one
validation item per request (any kind whose load it can drive).
The configuration with the most requests/s (mean over the client counts) whose p99 stays under
the cap is what the release's config.pbtxt then carries. The figures are the release machine's:
the result is cached per model and grid in the work directory, like every other step.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from hf2triton.clients.triton import TritonAdmin, TritonGrpc
from hf2triton.errors import DeployError, Hf2TritonError
from hf2triton.kinds.base import Data, to_json
from hf2triton.release.load import LoadResult, closed_loop
from hf2triton.release.repository import BATCHING, build_repository
from hf2triton.release.shipped import Shipped
from hf2triton.release.traffic import search_items, warmup_items
from hf2triton.spec import TuningSpec
from hf2triton.targets import DeploySection, triton_local
from hf2triton.util.net import reserved_ports
from hf2triton.util.runs import in_prefect_run, step_logger
from hf2triton.util.waiting import wait_for
from hf2triton.util.workspace import cached_step, digest, sha256_file

# What the search varies: every serving knob but max_batch_size (the requests' contract).
SETTINGS = tuple(k for k in BATCHING if k != "max_batch_size")


class TuneResult(TypedDict):
    chosen: dict[str, Any]  # the SETTINGS of the shipped configuration
    cells: list[dict[str, Any]]  # every configuration with its figures
    cap_met: bool  # False: no configuration kept p99 under max_p99_ms (the fastest ships)
    reused: bool


def grid(tuning: TuningSpec, deploy: DeploySection) -> list[dict[str, Any]]:
    """Every configuration to measure, the deploy section's own first."""
    sizes = tuning.preferred_batch_sizes or [deploy.preferred_batch_sizes]
    budgets = tuning.max_batch_tokens or [deploy.max_batch_tokens]
    own = {k: getattr(deploy, k) for k in SETTINGS}
    cells = [own]
    for pbs, delay, (inst, threads), budget in itertools.product(
        sizes, tuning.max_queue_delay_us, tuning.execution, budgets
    ):
        cell = {
            "preferred_batch_sizes": list(pbs),
            "max_queue_delay_us": delay,
            "instance_count": inst,
            "intra_op_threads": threads,
            "max_batch_tokens": budget,
        }
        if cell not in cells:
            cells.append(cell)
    return cells


def describe(cell: dict[str, Any]) -> str:
    return (
        f"batch sizes {'/'.join(map(str, cell['preferred_batch_sizes']))}, queue delay "
        f"{cell['max_queue_delay_us']} us, {cell['instance_count']} instance(s) x "
        f"{cell['intra_op_threads'] or 'default'} thread(s), sub-batches of "
        f"{cell.get('max_batch_tokens') or 'unbounded'} tokens"
    )


def measure(
    url: str,
    model: str,
    requests: list[dict[str, np.ndarray]],
    clients: int,
    seconds: float,
    warmup_s: float,
) -> dict[str, Any]:
    """One point of a configuration: `clients` closed-loop gRPC clients for `seconds`."""

    async def run() -> LoadResult:
        call = TritonGrpc(url, model)
        try:
            return await closed_loop(
                call, requests, clients, seconds, warmup_s, request_timeout_s=60
            )
        finally:
            await call.close()

    found = asyncio.run(run())
    # A failure while warming up counts too: a configuration with errors never ships.
    return {
        "clients": clients,
        "requests": found.requests,
        "errors": found.errors + found.warmup_errors,
        "rps": found.rps,
        "p50_ms": found.p50_ms,
        "p99_ms": found.p99_ms,
    }


def choose(cells: list[dict[str, Any]], max_p99_ms: float | None) -> tuple[dict[str, Any], bool]:
    """The cell with the most requests/s over its points, among those without errors and with
    p99 under the cap at every point; without any such cell, the fastest error-free one."""
    clean = [
        c
        for c in cells
        if c["points"]
        and not any(
            p["errors"] or not p["requests"] or not np.isfinite(p["p99_ms"]) for p in c["points"]
        )
    ]
    if not clean:
        raise DeployError(
            "configuration search: every configuration failed requests; see the "
            "server log in the tune step's directory"
        )
    capped = [
        c
        for c in clean
        if max_p99_ms is None or all(p["p99_ms"] <= max_p99_ms for p in c["points"])
    ]
    best = max(capped or clean, key=lambda c: c["score_rps"])
    return best, bool(capped)


@dataclass(frozen=True)
class _Server:
    """The search's private tritonserver: its admin client and process, its gRPC port, the
    repository it polls and where each cell's repository is built."""

    admin: TritonAdmin
    proc: subprocess.Popen[bytes]
    grpc: int
    repo: Path
    builds: Path

    def wait(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        wait_for(ready, timeout_s, f"configuration search: {what}", self.proc)


@dataclass(frozen=True)
class _Search:
    """One configuration search: the shipped candidate each cell's repository is built from,
    and how it is driven."""

    shipped: Shipped
    model_name: str
    deploy: DeploySection
    warmup_items: list[Any]
    requests: list[dict[str, np.ndarray]]
    knobs: dict[str, Any]

    def run(self, cells: list[dict[str, Any]], out: Path) -> list[dict[str, Any]]:
        """Every cell measured on a private tritonserver on free loopback ports."""
        repo = out / "server-repository"
        repo.mkdir()
        try:
            with reserved_ports(3) as (http, grpc, metrics):
                ports = triton_local.ServerPorts("127.0.0.1", http, grpc, metrics)
                proc = triton_local.launch(repo, ports, out / "server.log")
                admin = TritonAdmin(f"127.0.0.1:{http}")
                server = _Server(admin, proc, grpc, repo, out / "builds")
                try:
                    admin.wait_live(
                        self.deploy.ready_timeout_s,
                        "configuration search: the private tritonserver did not start",
                        proc,
                    )
                    return [
                        self.measure_cell(server, f"{self.model_name}-tune-{i}", cell)
                        for i, cell in enumerate(cells)
                    ]
                finally:
                    admin.close()
                    triton_local.terminate(proc)  # the server and its Python-backend stubs
        finally:
            shutil.rmtree(out / "builds", ignore_errors=True)
            shutil.rmtree(repo, ignore_errors=True)

    def measure_cell(self, server: _Server, name: str, cell: dict[str, Any]) -> dict[str, Any]:
        """One cell loaded into the running server, measured, and unloaded."""
        built = build_repository(
            self.shipped, name, {**self.knobs, **cell}, self.warmup_items, str(server.builds)
        )
        shutil.copytree(Path(built["repository"]) / name, server.repo / name)
        row: dict[str, Any] = {
            "settings": cell,
            "name": describe(cell),
            "points": [],
            "score_rps": 0.0,
        }
        try:
            server.admin.load(name)
            server.wait(
                lambda: server.admin.model_ready(name),
                self.deploy.ready_timeout_s,
                f"{name} did not load",
            )
        except Hf2TritonError as exc:
            if server.proc.poll() is not None:
                raise
            row["failed"] = " ".join(str(exc).split())[:300]  # never ships
        else:
            row["points"] = self.points(f"127.0.0.1:{server.grpc}", name)
            row["score_rps"] = float(np.mean([p["rps"] for p in row["points"]]))
        server.admin.unload(name)
        server.wait(lambda: not server.admin.model_ready(name), 120, f"{name} did not unload")
        shutil.rmtree(server.repo / name)
        return row

    def points(self, url: str, name: str) -> list[dict[str, Any]]:
        """The cell driven at each client count of `deploy.tuning`."""
        tuning = self.deploy.tuning
        return [
            measure(url, name, self.requests, n, tuning.seconds, min(2.0, tuning.seconds))
            for n in tuning.clients
        ]


def tune_config(
    shipped: Shipped, model_name: str, deploy: DeploySection, data: Data, work_root: str
) -> TuneResult:
    """Measure every configuration of `deploy.tuning` on a private server, sending the
    validation items of `data`; return the best."""
    kind, tuning = shipped.kind, deploy.tuning
    items = search_items(data.items)
    if not items:
        raise DeployError("configuration search: no validation item to send")
    cells = grid(tuning, deploy)
    knobs = {k: getattr(deploy, k) for k in BATCHING}
    search = _Search(
        shipped,
        model_name,
        deploy,
        warmup_items(data.items, kind.item_size),
        kind.requests(items),
        knobs,
    )
    key = digest(
        [
            model_name,
            kind.name,
            sha256_file(shipped.path) if Path(shipped.path).is_file() else shipped.path,
            to_json(shipped.config.to_dict()),
            to_json(shipped.info),
            {**knobs, "runtime": shipped.runtime},
            cells,
            tuning.model_dump(),
            to_json(items),
            sha256_file(__file__),
        ]
    )

    def build(out: Path) -> dict[str, Any]:
        measured = search.run(cells, out)
        best, cap_met = choose(measured, tuning.max_p99_ms)
        (out / "tuning.json").write_text(json.dumps(measured, indent=1) + "\n")
        return {"chosen": best["settings"], "cells": measured, "cap_met": cap_met}

    done = cached_step(work_root, "tune", key, build)
    result = TuneResult(
        chosen=done.result["chosen"],
        cells=done.result["cells"],
        cap_met=done.result["cap_met"],
        reused=done.reused,
    )
    _report(result, tuning)
    return result


def _report(result: TuneResult, tuning: TuningSpec) -> None:
    if not in_prefect_run():
        return
    from prefect.artifacts import create_table_artifact

    logger = step_logger()
    rows = []
    for c in result["cells"]:
        shipped = c["settings"] == result["chosen"]
        row = {
            "configuration": c["name"],
            "ships": "yes" if shipped else "",
            "failed": c.get("failed", ""),
        }
        for p in c["points"]:
            row[f"req/s @{p['clients']}"] = round(p["rps"], 1)
            row[f"p99 ms @{p['clients']}"] = round(p["p99_ms"], 1)
            row[f"errors @{p['clients']}"] = p["errors"]
        rows.append(row)
        logger.info(
            "tune: %s: %s%s",
            c["name"],
            c.get("failed")
            or ", ".join(
                f"{p['rps']:.0f} req/s p99 {p['p99_ms']:.0f} ms @{p['clients']}"
                for p in c["points"]
            ),
            " -> ships" if shipped else "",
        )
    if not result["cap_met"]:
        logger.warning(
            "tune: no configuration kept p99 under %.0f ms at every client count; "
            "the fastest ships",
            tuning.max_p99_ms,
        )
    create_table_artifact(
        rows,
        key="triton-config-search",
        description="Triton configuration search: closed-loop gRPC clients, "
        "one sentence per request, on the release machine",
    )
