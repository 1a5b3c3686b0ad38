"""Deploy target `triton-replicas`: three real tritonserver processes on 127.0.0.1, each with its
own model repository. A rollout reaches all of them or none: when one replica cannot load the new
version, all three keep serving the old one. Real MLflow (SQLite), tiny real models."""

from __future__ import annotations

import os
import signal
import subprocess
import venv
from contextlib import closing, suppress
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from hf2triton.flows.release import release_model
from hf2triton import triton_local
from hf2triton.errors import DeployError, SmokeTestError, SpecError
from hf2triton.spec import load_spec, parse_spec
from tests.served import serving_versions
from tests.conftest import free_port, tiny_spec, wait_http

pytestmark = pytest.mark.e2e  # every test here starts a server or runs a release

TEXTS = ["the quick brown fox", "thanks a lot", "prices rose 12.5%!"]


class Replica:
    def __init__(self, root: Path, own_env: Path | None = None):
        self.repo = root / "models"
        self.repo.mkdir(parents=True)
        self.ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
        self.http, self.grpc = (f"127.0.0.1:{self.ports[k]}" for k in ("http", "grpc"))
        # Triton's Python backend imports from the environment whose bin/ is first on PATH.
        extra = {"PATH": f"{own_env / 'bin'}:/usr/bin:/bin"} if own_env else None
        self.proc = triton_local.launch(self.repo, "127.0.0.1", self.ports["http"],
                                        self.ports["grpc"], self.ports["metrics"],
                                        root / "server.log", extra_env=extra)

    def spec(self) -> dict[str, str]:
        return {"http": self.http, "grpc": self.grpc, "model_repository": str(self.repo)}

    def serving(self, model: str) -> list[str]:
        with closing(httpclient.InferenceServerClient(url=self.http)) as client:
            return serving_versions(client, model)

    def embed(self, model: str) -> np.ndarray:
        inp = httpclient.InferInput("TEXT", [len(TEXTS), 1], "BYTES")
        inp.set_data_from_numpy(np.array([[t.encode()] for t in TEXTS], dtype=np.object_))
        with closing(httpclient.InferenceServerClient(url=self.http)) as client:
            return client.infer(model, [inp]).as_numpy("EMBEDDING")

    def terminate(self) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)

    def wait(self) -> None:
        # Triton unloads the models within a second or two of SIGTERM, then lingers for about
        # 30 s before it exits; nothing is left to lose by then.
        try:
            self.proc.wait(8)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replicas")
    # The third replica serves from an environment of its own that sees the serving environment's
    # packages through a .pth file; a module planted in its site-packages shadows the real one:
    # a node whose environment went bad after it started (what it serves keeps running).
    env = tmp / "replica-3-env"
    venv.create(env, with_pip=False, symlinks=True)
    site = next(env.glob("lib/python3*/site-packages"))
    serving_site = next(triton_local.serving_env().glob("lib/python3*/site-packages"))
    (site / "serving.pth").write_text(f"{serving_site}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF2TRITON_HOME", str(tmp / "home"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        started: list[Replica] = []
        try:
            for i in range(3):
                started.append(Replica(tmp / f"replica-{i + 1}", env if i == 2 else None))
            for r in started:
                wait_http(f"http://{r.http}/v2/health/live", timeout=120, proc=r.proc)
            yield tmp, started, site
        finally:
            for r in started:  # all at once: each may wait for its exit timeout
                r.terminate()
            for r in started:
                r.wait()


def _spec(tmp: Path, model_dir: Path, replicas: list[Replica], name: str, **overrides):
    ports = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    return load_spec(tiny_spec(tmp / name, model_dir, ports, deploy__target="triton-replicas",
                               deploy__replicas=[r.spec() for r in replicas],
                               image__build=False, **overrides))


def _champion(model: str) -> str:
    from mlflow import MlflowClient

    from hf2triton.clients.mlflow import tracking_uri

    return str(MlflowClient(tracking_uri(), registry_uri=tracking_uri())
               .get_model_version_by_alias(model, "champion").version)


def test_spec_needs_replicas_for_the_replica_target():
    base = {"name": "x", "source": {"path": "/m"}, "validation": {"sentences": "/s"},
            "registry": {"model_name": "x"}}
    with pytest.raises(SpecError, match=r"missing key 'deploy.replicas' \(deploy.target "
                                        "'triton-replicas'\)"):
        parse_spec({**base, "deploy": {"target": "triton-replicas"}})
    with pytest.raises(SpecError, match="at least 1 item"):
        parse_spec({**base, "deploy": {"target": "triton-replicas", "replicas": []}})
    with pytest.raises(SpecError, match="not an endpoint"):
        parse_spec({**base, "deploy": {"target": "triton-replicas", "replicas": [
            {"http": "http://a:8000", "grpc": "a:8001", "model_repository": "/r"}]}})
    with pytest.raises(SpecError, match=r"unknown key 'deploy.replicas' \(deploy.target "
                                        "'local-triton'\)"):
        parse_spec({**base, "deploy": {"replicas": [
            {"http": "a:8000", "grpc": "a:8001", "model_repository": "/r"}]}})


def test_rollout_to_three_replicas_where_one_fails_leaves_all_on_the_old_version(
        replicas, tiny_bert, other_tiny_bert, monkeypatch):
    tmp, reps, site = replicas
    monkeypatch.setenv("HF2TRITON_HOME", str(tmp / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    first = release_model(_spec(tmp, tiny_bert, reps, "first.yaml"))
    model = first["endpoint"]["model"]
    assert [r["http"] for r in first["endpoint"]["replicas"]] == [r.http for r in reps]
    assert [r.serving(model) for r in reps] == [["1"]] * 3
    before = [r.embed(model) for r in reps]
    assert all(np.allclose(b, before[0], atol=1e-5) for b in before)

    # Replica 3's environment breaks: its Python backend can no longer import tokenizers, so it
    # cannot load a new version.
    (site / "tokenizers.py").write_text("raise ImportError('tokenizers is broken on this node')\n")
    try:
        with pytest.raises(DeployError, match=r"failed to load on 1 of 3 replicas .*"
                           + reps[2].http.replace(".", r"\.") + r".*Rolled back on every replica"
                           r": version 1 keeps serving"):
            release_model(_spec(tmp, other_tiny_bert, reps, "second.yaml"))
        for r, b in zip(reps, before):
            assert r.serving(model) == ["1"], r.http
            assert np.allclose(r.embed(model), b, atol=1e-6), r.http
            assert sorted(p.name for p in (r.repo / model).iterdir() if p.name.isdigit()) == ["1"]
        assert _champion(model) == "1"
    finally:
        (site / "tokenizers.py").unlink()

    # Every replica loads it now, but the smoke test fails (a gate of 1.0 cannot be met by a
    # served model that is not bit-identical to PyTorch): the rollback hook puts all three back.
    with pytest.raises(SmokeTestError, match="replica 127.0.0.1:.*champion was not moved"):
        release_model(_spec(tmp, other_tiny_bert, reps, "second.yaml",
                            embedding__smoke_min_cosine=1.0))
    for r, b in zip(reps, before):
        assert r.serving(model) == ["1"], r.http
        assert np.allclose(r.embed(model), b, atol=1e-6), r.http
    assert _champion(model) == "1"

    # The node is fixed: the same release now rolls forward on all three and retires version 1.
    again = release_model(_spec(tmp, other_tiny_bert, reps, "second.yaml"))
    new = again["mlflow"]["version"]
    assert new == "2"
    assert [r.serving(model) for r in reps] == [[new]] * 3
    after = [r.embed(model) for r in reps]
    assert all(np.allclose(a, after[0], atol=1e-5) for a in after)
    assert not np.allclose(after[0], before[0], atol=1e-3)
    assert _champion(model) == new
