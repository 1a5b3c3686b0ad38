"""The `triton-replicas` target's front (`deploy.front`): HAProxy (Debian's package) on this
machine, on ports of its own, spreading each protocol's requests over the replicas. Its health
checks ask each replica's Triton whether the model is ready every `check_interval_ms` (every
100 ms after a 5xx); a replica that fails it is taken out, and a request that found its
connection refused or closed with no answer (what a killed server does to what it had) is sent
again to another replica, so a lost node costs its clients nothing once HAProxy holds the request
(retry-on, redispatch).

HAProxy runs as a daemon that outlives the release (as the local target's Triton does); its
configuration, pid file and admin socket are in $HF2TRITON_HOME/fronts/<model>/. A release whose
replicas changed reloads it softly (`-sf`: the old process finishes what it holds). `hf2triton
server stop` stops it with the local server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from hf2triton.errors import DeployError
from hf2triton.util.specbase import Strict
from hf2triton.util.workspace import home


class ReplicasFrontSpec(Strict):
    """`deploy.front` of `triton-replicas`: where clients connect instead of a replica."""

    host: str = Field("127.0.0.1", description="the address the front listens on")
    http_port: int = Field(ge=1, le=65535, description="the front's port for Triton's HTTP")
    grpc_port: int = Field(ge=1, le=65535, description="the front's port for Triton's gRPC")
    openai_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="the front's port for the OpenAI-compatible API (every replica names "
        "its `openai`)",
    )
    check_interval_ms: int = Field(
        500, ge=100, le=60_000, description="how often each replica's readiness is asked"
    )

    @model_validator(mode="after")
    def _ports_differ(self) -> ReplicasFrontSpec:
        ports = [p for p in (self.http_port, self.grpc_port, self.openai_port) if p]
        if len(set(ports)) != len(ports):
            raise ValueError(f"deploy.front's ports must differ: {ports}")
        return self

    def ports(self) -> dict[str, int]:
        out = {"http": self.http_port, "grpc": self.grpc_port}
        if self.openai_port:
            out["openai"] = self.openai_port
        return out


def _server(proto: str, index: int, replica: Any, check: str) -> str:
    """One replica as a server of `proto`'s backend, health-checked on its Triton's HTTP."""
    target = replica.http if proto == "http" else getattr(replica, proto)
    host, port = replica.http.rsplit(":", 1)
    h2 = " proto h2" if proto == "grpc" else ""
    return f"  server r{index} {target}{h2} check addr {host} port {port} check-proto h1 {check}"


def config(spec: ReplicasFrontSpec, replicas: list[Any], run_dir: Path, model: str) -> str:
    """haproxy.cfg: a frontend and a least-connections backend per protocol, every replica in
    each, checked on whether its Triton has `model` ready (not the server's readiness, which a
    version that failed to load, or any other model, takes away)."""
    # A replica that answers 500/502-504 (its OpenAI API while its Triton is gone) is checked
    # again within 100 ms; only its readiness check takes it out (a 5xx that both replicas
    # give, an API's stale index say, must not take both out).
    check = (
        f"inter {spec.check_interval_ms} fastinter 100 fall 1 rise 2 "
        "observe layer7 error-limit 1 on-error fastinter"
    )
    lines = [
        "global",
        f"  stats socket {run_dir / 'admin.sock'} mode 600 level admin",
        "  hard-stop-after 10m",
        "defaults",
        "  mode http",
        "  option dontlognull",
        "  timeout connect 2s",
        # The whole request is read before it is sent on, so a retry can send it again.
        "  option http-buffer-request",
        "  timeout client 10m",
        "  timeout server 10m",
        "  timeout http-keep-alive 2m",
        "  option redispatch 1",
        "  retry-on conn-failure empty-response 502 503 504",
        f"  retries {max(3, len(replicas))}",
    ]
    for proto, port in spec.ports().items():
        h2 = " proto h2" if proto == "grpc" else ""
        lines += [
            f"frontend {proto}",
            f"  bind {spec.host}:{port}{h2}",
            f"  default_backend {proto}",
            f"backend {proto}",
            "  balance leastconn",
            f"  option httpchk GET /v2/models/{model}/ready",
        ]
        lines += [_server(proto, i, r, check) for i, r in enumerate(replicas)]
    return "\n".join(lines) + "\n"


def stat_rows(text: str) -> list[dict[str, str]]:
    """HAProxy's `show stat` (CSV under a "# name,..." header) as one dict a row."""
    rows = text.splitlines()
    head = rows[0].lstrip("# ").split(",") if rows else []
    return [dict(zip(head, row.split(","), strict=False)) for row in rows[1:]]


class ReplicasFront:
    """The front of one model's replicas on this machine: its HAProxy daemon and files."""

    def __init__(self, model_name: str, run_dir: Path | None = None):
        self.model_name = model_name
        self.dir = run_dir or home() / "fronts" / model_name
        self.cfg, self.pidfile = self.dir / "haproxy.cfg", self.dir / "haproxy.pid"

    def pid(self) -> int | None:
        """The running daemon's pid, or None."""
        try:
            pid = int(self.pidfile.read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        return pid

    def ensure(self, spec: ReplicasFrontSpec, replicas: list[Any]) -> str:
        """The front running with this configuration: started, reloaded softly when the
        replicas or ports changed, else left alone. Returns what it did."""
        binary = shutil.which("haproxy")
        if binary is None:
            raise DeployError(
                "deploy.front needs HAProxy on this machine (`apt-get install haproxy`, which "
                "infra/setup.sh does as root), or leave deploy.front out; nothing was changed"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        text, pid = config(spec, replicas, self.dir, self.model_name), self.pid()
        if pid is not None and self.cfg.is_file() and self.cfg.read_text() == text:
            return "unchanged"
        staged = self.dir / "haproxy.cfg.new"
        staged.write_text(text)
        checked = subprocess.run(
            [binary, "-c", "-q", "-f", str(staged)], capture_output=True, text=True, timeout=30
        )
        if checked.returncode != 0:
            raise DeployError(f"HAProxy refused the front's configuration: {checked.stderr[-800:]}")
        # Started from the staged file, which becomes haproxy.cfg only once it runs: a front
        # that did not start leaves the running one and its configuration as they were.
        args = [binary, "-D", "-p", str(self.pidfile), "-f", str(staged)]
        started = subprocess.run(
            args + (["-sf", str(pid)] if pid else []), capture_output=True, text=True, timeout=30
        )
        if started.returncode != 0:
            staged.unlink(missing_ok=True)
            raise DeployError(
                f"the front (HAProxy) did not start on {spec.host}:{spec.ports()}: "
                f"{started.stderr[-800:]}"
            )
        staged.replace(self.cfg)
        self._wait_listening(spec)
        return "reloaded" if pid else "started"

    def _wait_listening(self, spec: ReplicasFrontSpec, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        for port in spec.ports().values():
            while True:
                try:
                    socket.create_connection((spec.host, port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise DeployError(
                            f"the front did not listen on {spec.host}:{port} within {timeout_s:g} s"
                        ) from None
                    time.sleep(0.05)

    def admin(self, command: str) -> str:
        """One command of HAProxy's runtime API, over its admin socket."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.dir / "admin.sock"))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")

    def states(self) -> dict[str, dict[str, str]]:
        """Each backend's servers and their state (UP, DOWN, ...)."""
        out: dict[str, dict[str, str]] = {}
        for r in stat_rows(self.admin("show stat")):
            if r.get("svname") not in (None, "", "FRONTEND", "BACKEND"):
                out.setdefault(r["pxname"], {})[r["svname"]] = r.get("status", "")
        return out

    def stop(self, timeout_s: float = 15.0) -> bool:
        """Stop the daemon (what it holds finishes first, up to `timeout_s`); False if none
        ran."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGUSR1)  # soft stop: finish what is in flight
        deadline = time.monotonic() + timeout_s
        while self.pid() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.pid() is not None:
            os.kill(pid, signal.SIGTERM)
        self.pidfile.unlink(missing_ok=True)
        return True


def stop_fronts() -> list[str]:
    """Stop every replicas' front this home started; returns their models."""
    root = home() / "fronts"
    found = sorted(p.parent.name for p in root.glob("*/haproxy.pid")) if root.is_dir() else []
    return [m for m in found if ReplicasFront(m).stop()]
