"""At team scale: MLflow on PostgreSQL with its artifacts in an S3-compatible store, and Triton
loading the served model repository from that store.

The tests start their own PostgreSQL cluster (Debian's postgresql package, which `infra/setup.sh
--test` installs) in a temporary directory on a free loopback port, a real S3-protocol server
(`moto_server` from PyPI's moto[server]; there is no MinIO or AWS here), a real `mlflow server`
on both, and run one tiny release end to end: registered through that MLflow, served by a local
tritonserver reading `s3://`. Everything they start, they stop.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from hf2triton.targets import triton_local
from hf2triton.targets.local import LocalTriton
from tests.conftest import MLFLOW_SERVER_ENV, free_port, graph_file, tiny_spec, wait_http

pytestmark = pytest.mark.e2e  # every test here starts a server or runs a release


def _pg_bin() -> Path | None:
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return found[-1].parent if found else None


def _as_owner(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: under root the cluster belongs to the postgres user.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def postgres():
    pg = _pg_bin()
    if pg is None:
        if os.environ.get("CI") == "true":
            pytest.fail(
                "PostgreSQL is not installed: `bash infra/setup.sh --test` installs it "
                "(as root) from Debian's postgresql package"
            )
        pytest.skip("PostgreSQL is not installed (sudo apt-get install postgresql)")
    # Not pytest's tmp_path: its parents are private to root, and the server runs as postgres.
    root = Path(tempfile.mkdtemp(prefix="hf2triton-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data, sock, log = root / "data", root / "sock", root / "server.log"
    port = free_port()
    subprocess.run(
        _as_owner(
            [
                str(pg / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            ]
        ),
        check=True,
        capture_output=True,
    )
    subprocess.run(_as_owner(["mkdir", str(sock)]), check=True)
    started = subprocess.run(
        _as_owner(
            [
                str(pg / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-w",
                "-t",
                "90",
                "-o",
                f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off",
                "start",
            ]
        ),
        capture_output=True,
        text=True,
    )
    try:
        if started.returncode != 0:
            pytest.fail(f"PostgreSQL did not start: {started.stderr}\n{log.read_text()[-2000:]}")
        subprocess.run(
            _as_owner(
                [
                    str(pg / "createdb"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-U",
                    "postgres",
                    "mlflow",
                ]
            ),
            check=True,
        )
        yield f"postgresql://postgres@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run(
            _as_owner([str(pg / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


# Credentials of the test's own S3 server; the secret is searched for where it must not be.
S3_KEY = "AKIAHF2TRITONTEST"
S3_SECRET = f"s3-secret-{uuid.uuid4().hex}"
BUCKET = "models"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """A real S3-protocol server (moto_server) on a free loopback port, with bucket `models`."""
    import boto3

    root = tmp_path_factory.mktemp("s3")
    port = free_port()
    exe = Path(sys.executable).parent / "moto_server"
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{endpoint}/moto-api/", timeout=60, proc=proc)
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=S3_KEY,
            aws_secret_access_key=S3_SECRET,
        )
        s3.create_bucket(Bucket=BUCKET)
        yield endpoint, s3
    finally:
        triton_local.stop_group(proc.pid, 20)
        proc.wait(10)


@pytest.fixture(scope="module")
def mlflow_on_postgres(postgres, s3_server, tmp_path_factory):
    """`mlflow server` with its store in PostgreSQL and its artifacts in the S3 bucket (proxied:
    only the server holds the store's credentials)."""
    endpoint, _ = s3_server
    root = tmp_path_factory.mktemp("mlflow-pg")
    port = free_port()
    cmd = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--backend-store-uri",
        postgres,
        "--artifacts-destination",
        f"s3://{BUCKET}/mlflow",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = {
        **os.environ,
        **MLFLOW_SERVER_ENV,
        "MLFLOW_S3_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": S3_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=180, proc=proc)
        yield f"http://127.0.0.1:{port}", postgres
    finally:
        triton_local.stop_group(proc.pid, 20)
        proc.wait(10)


def _sha256(s3, key: str) -> str:
    import hashlib

    return hashlib.sha256(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()).hexdigest()


def test_release_with_mlflow_on_postgresql_and_the_repository_in_s3(
    mlflow_on_postgres, s3_server, tiny_bert, hf2triton_home, deploy_ports, tmp_path, monkeypatch
):
    import psycopg2
    from mlflow import MlflowClient

    from hf2triton.errors import DeployError
    from hf2triton.flows.release import release_model
    from hf2triton.spec import load_spec
    from hf2triton.util.workspace import hash_files
    from tests.served import serving_versions, triton_client

    # Every log record of the release, whatever the process's logging configuration does with it
    # (Prefect's set-up can replace pytest's capture on the root logger, and after other tests in
    # one session the run loggers' records did not reach it): recorded where loggers handle them,
    # at INFO and above.
    logged: list[str] = []
    handle, enabled = logging.Logger.handle, logging.Logger.isEnabledFor

    def recording(self, record):
        logged.append(record.getMessage())
        return handle(self, record)

    monkeypatch.setattr(logging.Logger, "handle", recording)
    monkeypatch.setattr(
        logging.Logger,
        "isEnabledFor",
        lambda self, level: level >= logging.INFO or enabled(self, level),
    )
    uri, database = mlflow_on_postgres
    endpoint, s3 = s3_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # The release reads the store's key pair from the environment (or a Prefect block).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    store = {"kind": "s3", "endpoint": endpoint, "bucket": BUCKET, "prefix": "triton/prod"}
    spec_path = tiny_spec(
        tmp_path / "tiny.yaml",
        tiny_bert,
        deploy_ports,
        image__build=False,
        deploy__model_store=store,
    )
    summary = release_model(load_spec(spec_path))
    assert summary["mlflow"]["tracking_uri"] == uri
    version = summary["mlflow"]["version"]

    # The record is in PostgreSQL's tables, not in some SQLite file beside the server.
    with psycopg2.connect(database) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT version, source FROM model_versions WHERE name = %s", ("tiny-embedder",)
        )
        rows = cur.fetchall()
        cur.execute(
            "SELECT alias, version FROM registered_model_aliases WHERE name = %s",
            ("tiny-embedder",),
        )
        aliases = dict(cur.fetchall())
    assert [str(v) for v, _ in rows] == [version]
    assert rows[0][1].endswith("/triton_repository")
    assert {k: str(v) for k, v in aliases.items()} == {"candidate": version, "champion": version}

    client = MlflowClient(uri, registry_uri=uri)
    mv = client.get_model_version("tiny-embedder", version)
    assert mv.tags["smoke.grpc_min_cosine"]
    arts = {a.path for a in client.list_artifacts(mv.run_id, "triton_repository/tiny-embedder")}
    assert "triton_repository/tiny-embedder/config.pbtxt" in arts
    # MLflow's artifacts are objects in the bucket, not files beside the server.
    mlflow_keys = [
        o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="mlflow/").get("Contents", [])
    ]
    assert any(
        k.endswith(f"{mv.run_id}/artifacts/triton_repository/tiny-embedder/config.pbtxt")
        for k in mlflow_keys
    ), mlflow_keys[:20]

    # Triton serves from the bucket: its repository is the s3:// URI, the version's files are
    # objects whose sha256 is the one MLflow recorded, and the version answers.
    state = triton_local.read_state()
    assert state.model_repository == f"s3://{endpoint}/{BUCKET}/triton/prod"
    [built] = (hf2triton_home / "work" / "tiny-embedder" / "repository").glob("*/tiny-embedder/1")
    graph = graph_file(built)
    onnx_key = f"triton/prod/tiny-embedder/{version}/{graph}"
    assert _sha256(s3, onnx_key) == mv.tags[f"sha256.triton.tiny-embedder/1/{graph}"]
    assert not any(p.name == "tiny-embedder" for p in (hf2triton_home / "triton").rglob("*")), (
        "the served model must not be a local copy"
    )
    triton = triton_client(state.http_url)
    try:
        assert serving_versions(triton, "tiny-embedder") == [version]
    finally:
        triton.close()

    # A version that fails to load is removed from the bucket; the serving one stays.
    broken = tmp_path / "broken"
    [src] = (hf2triton_home / "work" / "tiny-embedder" / "repository").glob("*/tiny-embedder")
    shutil.copytree(src, broken / "tiny-embedder", ignore=shutil.ignore_patterns("__pycache__"))
    onnx = broken / "tiny-embedder" / "1" / graph
    onnx.write_bytes(onnx.read_bytes()[:1000])
    files = {f"tiny-embedder/{k}": v for k, v in hash_files(broken / "tiny-embedder").items()}
    spec = load_spec(spec_path)
    with pytest.raises(DeployError, match=f"Version {version} keeps serving"):
        LocalTriton(spec.deploy, spec.name).deploy(
            str(broken), "tiny-embedder", "99", files, {}, lambda endpoint: {}
        )
    assert not s3.list_objects_v2(Bucket=BUCKET, Prefix="triton/prod/tiny-embedder/99/").get(
        "Contents"
    )
    triton = triton_client(state.http_url)
    try:
        assert serving_versions(triton, "tiny-embedder") == [version]
    finally:
        triton.close()

    # The store's secret reached the server's environment only: not its state file, the logs,
    # or the MLflow record.
    assert S3_SECRET not in (hf2triton_home / "triton" / "server.json").read_text()
    log = "\n".join(logged)
    assert "register: tiny-embedder version" in log  # the release's log was recorded
    assert S3_SECRET not in log
    run = client.get_run(mv.run_id)
    assert S3_SECRET not in repr(run.data.params) + repr(run.data.tags) + repr(mv.tags)


def test_s3_store_without_credentials_or_bucket_is_refused(s3_server, monkeypatch):
    from hf2triton.errors import ModelStoreError
    from hf2triton.stores.s3 import S3ModelDir, S3Store

    endpoint, _ = s3_server
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    store = S3Store(kind="s3", endpoint=endpoint, bucket=BUCKET)
    with pytest.raises(ModelStoreError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        S3ModelDir(store, "m")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    missing = S3Store(kind="s3", endpoint=endpoint, bucket="no-such-bucket")
    with pytest.raises(ModelStoreError, match="no bucket 'no-such-bucket'"):
        S3ModelDir(missing, "m").versions()


def test_triton_on_an_s3_path_it_cannot_use_fails_at_once_and_says_why(
    s3_server, hf2triton_home, deploy_ports
):
    """Triton stays up but never becomes live on a repository it cannot read: the start must
    end with its reason (a permanent DeployError), not wait out the readiness timeout and end in
    a ServiceUnavailableError that the deploy step would retry."""
    from hf2triton.errors import DeployError

    endpoint, _ = s3_server
    env = {
        "AWS_ACCESS_KEY_ID": S3_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    with pytest.raises(DeployError, match="repository path is not a valid directory"):
        triton_local.ensure_server(
            triton_local.ServerPorts(
                "127.0.0.1",
                deploy_ports["http_port"],
                deploy_ports["grpc_port"],
                deploy_ports["metrics_port"],
            ),
            timeout_s=120,
            repository=f"s3://{endpoint}/{BUCKET}/nothing",
            extra_env=env,
        )
    assert triton_local.read_state() is None


def test_replicas_that_read_one_bucket_all_serve_the_release(
    s3_server, tiny_bert, hf2triton_home, deploy_ports, tmp_path, monkeypatch
):
    """Two Triton replicas started on the same s3:// repository (as pods on one bucket are): the
    release writes the version once, every replica loads it and passes the smoke test."""
    import yaml

    from hf2triton.flows.release import release_model
    from hf2triton.spec import load_spec
    from tests.served import serving_versions, triton_client

    endpoint, s3 = s3_server
    creds = {
        "AWS_ACCESS_KEY_ID": S3_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for k, v in creds.items():
        monkeypatch.setenv(k, v)
    store = {"kind": "s3", "endpoint": endpoint, "bucket": BUCKET, "prefix": "fleet"}
    spec_path = tiny_spec(
        tmp_path / "fleet.yaml",
        tiny_bert,
        deploy_ports,
        image__build=False,
        name="tiny-fleet",
        registry__model_name="tiny-fleet",
        deploy__model_store=store,
    )
    # The operator's step before starting replicas on an empty bucket folder.
    init = subprocess.run(
        [str(Path(sys.executable).parent / "hf2triton"), "store", "init", str(spec_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert init.returncode == 0, init.stderr
    uri = init.stdout.strip().removeprefix("--model-repository=")
    assert uri == f"s3://{endpoint}/{BUCKET}/fleet"

    replicas = []
    try:
        for i in range(2):
            ports = [free_port() for _ in range(3)]
            proc = triton_local.launch(
                uri,
                triton_local.ServerPorts("127.0.0.1", *ports),
                tmp_path / f"replica-{i}.log",
                extra_env=creds,
            )
            replicas.append((proc, f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"))
        for proc, http, _ in replicas:
            wait_http(f"http://{http}/v2/health/live", timeout=120, proc=proc)
        spec = yaml.safe_load(spec_path.read_text())
        spec["deploy"].update(
            target="triton-replicas", replicas=[{"http": h, "grpc": g} for _, h, g in replicas]
        )
        for key in ("host", "http_port", "grpc_port", "metrics_port"):  # replicas have their own
            spec["deploy"].pop(key)
        spec_path.write_text(yaml.safe_dump(spec))
        summary = release_model(load_spec(spec_path))
        version = summary["mlflow"]["version"]
        for _, http, _ in replicas:
            client = triton_client(http)
            try:
                assert serving_versions(client, "tiny-fleet") == [version]
            finally:
                client.close()
        keys = [
            o["Key"]
            for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="fleet/tiny-fleet/").get(
                "Contents", []
            )
        ]
        [built] = (hf2triton_home / "work" / "tiny-fleet" / "repository").glob("*/tiny-fleet/1")
        assert f"fleet/tiny-fleet/{version}/{graph_file(built)}" in keys
        assert "fleet/tiny-fleet/config.pbtxt" in keys
    finally:
        for proc, _, _ in replicas:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc, _, _ in replicas:
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
