"""Faults under live traffic lose nothing: MLflow stopping while `register` writes the release
(a hang, a crash and restart in time, a crash for good) and the Prefect worker killed mid-release
with its flow run each end in one complete MLflow version, never a half-written one in use."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf2triton.util.net import free_port
from tests.conftest import MLFLOW_SERVER_ENV, ROOT, tiny_spec, wait_http
from tests.flows.test_faults import HF2TRITON, _cli, _error_line, _fresh_env

pytestmark = pytest.mark.e2e  # every test here starts a server or runs a release

# ONNX Runtime's fp32 alone: the outages are what these tests check, not the gate's choice.
ORT_ONLY = [{"name": "onnxruntime", "precision": "fp32"}]
RECORD_ARTIFACTS = {"triton_repository", "model", "validation_report.json", "reference.json"}


class MlflowServer:
    """`mlflow server` (SQLite, local artifacts) on a fixed port, to stop and start again on the
    same port and store, as an operator restarts a crashed one."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.db = root / "mlflow.db"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.db}",
            "--artifacts-destination",
            str(self.root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        env = {**os.environ, **MLFLOW_SERVER_ENV}
        with open(self.root / "server.log", "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        wait_http(f"{self.uri}/health", timeout=180, proc=self.proc)

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """A crash: SIGKILL to the server and its workers."""
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGKILL)
            self.proc.wait(30)

    def runs(self) -> int:
        """Runs in the store (deleted ones too), read from its database, not through the server."""
        try:
            with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=1) as db:
                return db.execute("SELECT count(*) FROM runs").fetchone()[0]
        except sqlite3.Error:
            return 0

    def contents(self) -> tuple:
        """What the store holds, read from its database and artifact folder, not through the
        server: the rows of its runs, their records and the model versions, and every artifact
        file with its size."""
        try:
            db = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=1)
            try:
                tables = ("runs", "params", "metrics", "tags", "model_versions")
                rows = tuple(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables)
            finally:
                db.close()
        except sqlite3.Error:
            rows = None  # busy or being written: not quiet yet
        files = []
        for path in sorted((self.root / "artifacts").rglob("*")):
            try:
                if path.is_file():
                    files.append((str(path.relative_to(self.root)), path.stat().st_size))
            except FileNotFoundError:  # a temporary file gone meanwhile
                files.append((str(path), None))
        return rows, files

    def wait_quiet(self, timeout: float = 60) -> None:
        """Wait until the store stops changing: the same contents on two reads a second apart
        (what the server held when it froze is written by then)."""
        deadline = time.monotonic() + timeout
        before = self.contents()
        while True:
            time.sleep(1)
            now = self.contents()
            if now == before and now[0] is not None:
                return
            assert time.monotonic() < deadline, f"the store still changes after {timeout} s"
            before = now

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(self.uri, registry_uri=self.uri)


@pytest.fixture(scope="module")
def mlflow(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-outages"))
    server.start()
    try:
        yield server
    finally:
        server.kill()


def _whole_versions(server: MlflowServer, name: str, key: str | None = None) -> list:
    """The model's versions, each checked to carry the whole release record; and no run of the
    model left unfinished beside them."""
    client = server.client()
    versions = client.search_model_versions(f"name = '{name}'")
    for mv in versions:
        run = client.get_run(mv.run_id)
        assert run.info.lifecycle_stage == "active", f"v{mv.version}: its run is deleted"
        assert run.data.params and run.data.metrics, f"v{mv.version}: its run has no record"
        assert {a.path for a in client.list_artifacts(mv.run_id)} >= RECORD_ARTIFACTS
        assert client.list_artifacts(mv.run_id, "triton_repository"), f"v{mv.version}"
    if key is not None:
        exp = client.get_experiment_by_name("hf2triton")
        runs = client.search_runs([exp.experiment_id], f"tags.`hf2triton.release_key` = '{key}'")
        assert [r.info.status for r in runs] == ["FINISHED"] * len(versions), (
            "a run of the release that never finished is left beside its version"
        )
    return versions


# --- MLflow hangs inside register, at each point of the record ------------------------------


def _record(tmp: Path, key: str) -> dict:
    """A release record as hf2triton.release.record builds one, over small local files."""
    repo = tmp / "repo" / "tiny"
    (repo / "1").mkdir(parents=True)
    (repo / "config.pbtxt").write_text('name: "tiny"\n')
    (repo / "1" / "model.onnx").write_bytes(os.urandom(300_000))
    (tmp / "model").mkdir()
    (tmp / "model" / "model.onnx").write_bytes(os.urandom(200_000))
    (tmp / "validation_report.json").write_text('{"chosen": "fp32"}')
    (tmp / "reference.json").write_text('{"items": []}')
    return {
        "release_key": key,
        "lineage": {"source_id": "fixtures/tiny", "variant": "fp32", "sha256.model.onnx": "0" * 64},
        "metrics": {"mean_cosine": 0.999, "export_seconds": 1.5},
        "params": {"name": "tiny", "deploy": {"max_batch_size": 8, "sizes": [4, 8]}},
        "artifacts": {
            "triton_repository": str(tmp / "repo"),
            "model": str(tmp / "model"),
            "validation_report.json": str(tmp / "validation_report.json"),
            "reference.json": str(tmp / "reference.json"),
        },
    }


# The MLflow call after which the server stops answering: the run exists and holds nothing yet;
# part of the artifacts are uploaded; the version was created but its answer never came back
# (the run is still unfinished).
HANGS = {
    "after the run is created": ("create_run", 1),
    "half-way through the artifacts": ("log_artifacts", 1),
    "as the version is created": ("create_model_version", 1),
}


@pytest.mark.parametrize("point", HANGS)
def test_mlflow_hanging_during_register_leaves_one_complete_version_after_the_retry(
    mlflow, tmp_path, monkeypatch, point
):
    import requests

    from hf2triton.clients.mlflow import Registry
    from hf2triton.errors import ServiceUnavailableError

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")  # a hung server fails a call in 3 s
    name = f"hang-{HANGS[point][0].replace('_', '-')}"
    key = hashlib.sha256(point.encode()).hexdigest()
    record = _record(tmp_path, key)
    registry = Registry(mlflow.uri)
    method, after = HANGS[point]
    real, calls = getattr(registry.client, method), []

    def hang_after(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(method)
        if len(calls) == after:
            mlflow.signal(signal.SIGSTOP)  # a hang: requests wait, none is answered
            if method == "create_model_version":  # the version exists; its answer is lost
                raise requests.exceptions.ConnectionError("connection reset by peer")
        return result

    monkeypatch.setattr(registry.client, method, hang_after)
    try:
        with pytest.raises(ServiceUnavailableError):
            registry.register_release(name, "hf2triton", record)
    finally:
        mlflow.signal(signal.SIGCONT)
    wait_http(f"{mlflow.uri}/health", timeout=60)
    mlflow.wait_quiet()  # what the server held when it froze is written by now

    again = Registry(mlflow.uri).register_release(name, "hf2triton", record)  # the retry
    assert again["version"] == "1" and not again["reused"]
    versions = _whole_versions(mlflow, name, key)
    assert [str(v.version) for v in versions] == ["1"]
    assert Registry(mlflow.uri).register_release(name, "hf2triton", record)["reused"]
    assert len(_whole_versions(mlflow, name, key)) == 1


# --- MLflow crashes while a release registers: restarted in time, or not -------------------


@pytest.fixture(scope="module")
def outage_release(tmp_path_factory, tiny_bert):
    """One tiny release spec and hf2triton home for the crash tests (a later one reuses the
    steps before `register` of an earlier one); its local Triton is stopped after."""
    tmp = tmp_path_factory.mktemp("mlflow-crash")
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    spec = tiny_spec(
        tmp / "spec.yaml",
        tiny_bert,
        ports,
        name="tiny-outage",
        watch__enabled=False,
        runtime__candidates=ORT_ONLY,
    )
    home = tmp / "home"
    try:
        yield {"spec": spec, "home": home, "tmp": tmp}
    finally:
        _cli(["server", "stop"], _fresh_env(home))


def _release_crashing_mlflow_in_register(
    spec: Path, env: dict, server: MlflowServer, log: Path
) -> subprocess.Popen:
    """Start the release; SIGKILL MLflow as soon as `register` has created its run (read from
    MLflow's own database), before the version is there. Returns the running release."""
    before = server.runs()
    with open(log, "w") as err:
        release = subprocess.Popen(
            [HF2TRITON, "release", str(spec)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    deadline = time.monotonic() + 600
    while server.runs() == before:
        assert release.poll() is None, (
            f"the release ended before register:\n{log.read_text()[-3000:]}"
        )
        assert time.monotonic() < deadline, "the release did not reach register in 600 s"
        time.sleep(0.02)
    server.kill()
    return release


def _finished(release: subprocess.Popen, log: Path, timeout: float = 600):
    try:
        out, _ = release.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(release.pid, signal.SIGKILL)
        raise AssertionError(
            f"the release ran past {timeout} s:\n{log.read_text()[-3000:]}"
        ) from None
    return subprocess.CompletedProcess(release.args, release.returncode, out, log.read_text())


@pytest.fixture()
def own_mlflow(tmp_path):
    """A fresh MLflow server for one test, to crash and start again."""
    server = MlflowServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_mlflow_crashing_in_register_and_staying_down_fails_in_one_line_and_leaves_no_orphan(
    outage_release, own_mlflow, tmp_path
):
    rel, server = outage_release, own_mlflow
    env = _fresh_env(rel["home"], MLFLOW_TRACKING_URI=server.uri)  # retries 0.5 s apart
    log = tmp_path / "release.log"
    proc = _finished(_release_crashing_mlflow_in_register(rel["spec"], env, server, log), log)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = _error_line(proc)
    assert "[SERVICE_UNAVAILABLE]" in line and server.uri in line
    assert "Retry 2/2" in proc.stderr  # register was retried
    assert "Task run 'deploy" not in proc.stderr

    server.start()  # MLflow is back, on the same port and store
    # What the crash left is never a version without its record.
    _whole_versions(server, "tiny-embedder")
    rerun = _cli(["release", str(rel["spec"])], env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    summary = json.loads(rerun.stdout)
    assert summary["mlflow"]["version"] == "1"
    assert {"export", "validate"} <= set(summary["reused_steps"])
    key = server.client().get_model_version("tiny-embedder", "1").tags["hf2triton.release_key"]
    assert len(_whole_versions(server, "tiny-embedder", key)) == 1


def test_mlflow_crashing_in_register_and_restarted_in_time_finishes_with_one_version(
    outage_release, own_mlflow, tmp_path
):
    rel, server = outage_release, own_mlflow
    # Retries far enough apart for MLflow to start again (it takes 10 to 60 s here).
    env = _fresh_env(rel["home"], MLFLOW_TRACKING_URI=server.uri, HF2TRITON_RETRY_DELAYS="15,45,90")
    log = tmp_path / "release.log"
    release = _release_crashing_mlflow_in_register(rel["spec"], env, server, log)
    server.start()
    proc = _finished(release, log)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Retry 1/3" in proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["mlflow"]["version"] == "1"
    key = server.client().get_model_version("tiny-embedder", "1").tags["hf2triton.release_key"]
    assert len(_whole_versions(server, "tiny-embedder", key)) == 1


# --- the Prefect worker lost mid-release -----------------------------------------------------


def _reused_steps(env: dict, run_id: str, release: str) -> list[str]:
    """The reused steps the run's release report (its Prefect artifact) lists."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from hf2triton.release.report import artifact_key
    from tests.prefect_fixtures import _with_api

    async def artifacts():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
            )

    report = next(
        a for a in _with_api(env, artifacts) if a.key == artifact_key(release, "report")
    ).data
    line = next(line for line in report.splitlines() if line.startswith("- reused steps:"))
    return [s.strip() for s in line.split(":", 1)[1].split(",") if s.strip() != "none"]


def test_worker_killed_mid_release_then_the_rerun_finishes_with_one_version_and_no_half_step(
    prefect_server, tiny_bert
):
    from hf2triton.orchestration.deployments import render
    from hf2triton.orchestration.prefect_api import DEAD_RUN_AUTOMATION
    from hf2triton.util.workspace import DONE_FILE, hash_files
    from tests.flows.test_faults import _mlflow_versions
    from tests.prefect_fixtures import (
        BIN,
        _run,
        _start,
        _stop,
        cancel_open_runs,
        delete_automations,
        kill_worker,
        read_run,
        start_run,
    )

    env, tmp = dict(prefect_server["env"]), prefect_server["tmp"] / "worker-lost"
    tmp.mkdir()
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    name = "tiny-worker-lost"
    spec = tiny_spec(
        tmp / f"{name}.yaml",
        tiny_bert,
        ports,
        name=name,
        registry__model_name=name,
        watch__enabled=False,
        runtime__candidates=ORT_ONLY,
    )
    (tmp / "prefect.yaml").write_text(render([spec]))
    _run(
        [
            str(BIN / "prefect"),
            "--no-prompt",
            "deploy",
            "--all",
            "--prefect-file",
            str(tmp / "prefect.yaml"),
        ],
        env,
    )
    # Workers of this server's other tests beat at Prefect's default 180 s, which widens the
    # automation's window to 9 minutes; this test's beats every 30 s, and the first run's pull
    # step makes the automation anew.
    delete_automations(env, DEAD_RUN_AUTOMATION)
    home = tmp / "home"
    worker_env = {**env, "HF2TRITON_HOME": str(home), "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}
    worker_env.pop("MLFLOW_TRACKING_URI", None)
    worker_cmd = [
        str(BIN / "prefect"),
        "worker",
        "start",
        "--pool",
        "hf2triton-process",
        "--limit",
        "1",
    ]
    validate_dir = home / "work" / name / "validate"
    worker = _start(worker_cmd, worker_env, tmp / "worker.log")
    try:
        first = start_run(env, name)
        deadline, polled = time.monotonic() + 600, 0.0
        while not (
            validate_dir.is_dir() and any(p.name.endswith(".tmp") for p in validate_dir.iterdir())
        ):
            assert worker.poll() is None, (tmp / "worker.log").read_text()[-3000:]
            if time.monotonic() - polled > 5:
                state, polled = read_run(env, first).state, time.monotonic()
                assert not (state and state.is_final()), f"the run ended first: {state}"
            assert time.monotonic() < deadline, "the run did not reach validate in 600 s"
            time.sleep(0.02)
        kill_worker(worker)  # with the flow run's process, mid-validate
        assert not [p for p in validate_dir.iterdir() if not p.name.startswith(".")], (
            "validate finished before the kill"
        )
        assert read_run(env, first).state.type.value == "RUNNING"  # nobody left to end it

        worker = _start(worker_cmd, worker_env, tmp / "worker-2.log")
        second = start_run(env, name)  # at once: it waits for the dead run's slot
        deadline = time.monotonic() + 900
        while not ((run := read_run(env, second)).state and run.state.is_final()):
            assert time.monotonic() < deadline, (
                f"the re-run is still {run.state.name} after 900 s (the dead run is "
                f"{read_run(env, first).state.name})"
            )
            time.sleep(3)
        assert run.state.type.value == "COMPLETED", (tmp / "worker-2.log").read_text()[-5000:]
        dead = read_run(env, first).state
        assert dead.type.value == "CRASHED" and "heartbeat" in dead.message, dead

        assert _mlflow_versions(home) == [(name, "1")]
        reused = _reused_steps(env, second, name)
        assert {"export", "quantize"} <= set(reused), reused  # finished before the kill
        assert not {"validate", "register"} & set(reused), reused  # redone, not half-used
        finished = [p for p in validate_dir.iterdir() if not p.name.startswith(".")]
        assert len(finished) == 1  # the redone validate, whole: every file its marker names
        done = json.loads((finished[0] / DONE_FILE).read_text())
        assert hash_files(finished[0]) == done["files"]
    finally:
        _stop(worker)
        cancel_open_runs(env)
        subprocess.run(
            [HF2TRITON, "server", "stop"],
            env={**env, "HF2TRITON_HOME": str(home)},
            capture_output=True,
        )
