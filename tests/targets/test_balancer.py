"""The replicas' front (hf2triton/targets/balancer.py) with Debian's real HAProxy: its
configuration is one HAProxy accepts, it starts, reloads softly only when the replicas change,
reports what its health checks see, and stops. No Triton here: the replicas are ports nothing
listens on, so the checks find them down (test_replicas.py runs it before real replicas).
infra/setup.sh installs HAProxy; without it these fail, as the release would."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from hf2triton.targets.balancer import ReplicasFront, ReplicasFrontSpec, config, stop_fronts
from hf2triton.util.waiting import wait_until
from tests.conftest import free_port


def _replicas(n: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(
            http=f"127.0.0.1:{free_port()}",
            grpc=f"127.0.0.1:{free_port()}",
            openai=f"127.0.0.1:{free_port()}",
        )
        for _ in range(n)
    ]


def _spec(**more) -> ReplicasFrontSpec:
    return ReplicasFrontSpec(http_port=free_port(), grpc_port=free_port(), **more)


def test_ports_must_differ():
    with pytest.raises(ValidationError, match="ports must differ"):
        ReplicasFrontSpec(http_port=9000, grpc_port=9000)


def test_the_openai_port_needs_every_replica_to_name_its_api(tmp_path):
    from hf2triton.targets.replicas import ReplicasDeploy

    reps = [{"http": "10.0.0.1:8000", "grpc": "10.0.0.1:8001", "model_repository": str(tmp_path)}]
    with pytest.raises(ValidationError, match="name no `openai` endpoint"):
        ReplicasDeploy(
            target="triton-replicas",
            replicas=reps,
            front={"http_port": 9000, "grpc_port": 9001, "openai_port": 9002},
        )


def test_haproxy_accepts_the_configuration(tmp_path):
    text = config(_spec(openai_port=free_port()), _replicas(3), tmp_path, "m")
    (tmp_path / "haproxy.cfg").write_text(text)
    done = subprocess.run(
        ["haproxy", "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    # every replica in every backend, gRPC over HTTP/2, checked on the model's readiness
    assert text.count(" check addr ") == 9 and text.count("proto h2") == 4
    assert "option httpchk GET /v2/models/m/ready" in text


def test_starts_reloads_only_on_change_and_stops(tmp_path, monkeypatch):
    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path))
    front, spec, reps = ReplicasFront("m"), _spec(), _replicas(2)
    try:
        assert front.ensure(spec, reps) == "started"
        first = front.pid()
        assert first is not None
        assert front.ensure(spec, reps) == "unchanged" and front.pid() == first
        # nothing listens on the replicas' ports: the checks take both out
        assert wait_until(
            lambda: {s for b in front.states().values() for s in b.values()} == {"DOWN"}, 10
        ), front.states()
        assert front.ensure(spec, reps[:1]) == "reloaded"
        assert wait_until(lambda: front.pid() not in (None, first), 10)
        assert set(front.states()["http"]) == {"r0"}
    finally:
        stopped = stop_fronts()
    assert stopped == ["m"] and front.pid() is None


def test_a_port_in_use_is_refused_naming_it(tmp_path, monkeypatch):
    import socket

    from hf2triton.errors import DeployError

    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        spec = ReplicasFrontSpec(http_port=busy.getsockname()[1], grpc_port=free_port())
        with pytest.raises(DeployError, match="did not start"):
            ReplicasFront("m").ensure(spec, _replicas(1))
        assert not (tmp_path / "fronts" / "m" / "haproxy.cfg").exists()


def test_a_reload_that_fails_leaves_the_running_front_as_it_was(tmp_path, monkeypatch):
    import socket

    from hf2triton.errors import DeployError

    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path))
    front, spec, reps = ReplicasFront("m"), _spec(), _replicas(1)
    try:
        front.ensure(spec, reps)
        pid, before = front.pid(), front.cfg.read_text()
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            moved = ReplicasFrontSpec(http_port=busy.getsockname()[1], grpc_port=spec.grpc_port)
            with pytest.raises(DeployError, match="did not start"):
                front.ensure(moved, reps)
        assert front.pid() == pid and front.cfg.read_text() == before
        assert front.ensure(spec, reps) == "unchanged"
    finally:
        stop_fronts()


def test_server_stop_stops_the_fronts_too(tmp_path, monkeypatch):
    import os
    import sys
    from pathlib import Path

    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path))
    front = ReplicasFront("m")
    try:
        front.ensure(_spec(), _replicas(1))
        assert front.pid() is not None
        done = subprocess.run(
            [str(Path(sys.executable).parent / "hf2triton"), "server", "stop"],
            capture_output=True,
            text=True,
            env=dict(os.environ),
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "stopped the front (HAProxy) of m's replicas" in done.stdout
        assert front.pid() is None
    finally:
        stop_fronts()
