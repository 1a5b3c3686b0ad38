"""MLflow on PostgreSQL: a team's tracking server keeps its store in PostgreSQL, not SQLite.

The test starts its own PostgreSQL cluster (Debian's postgresql package, which `infra/setup.sh
--test` installs) in a temporary directory on a free loopback port, a real `mlflow server` on it,
and runs one tiny release end to end against that server. Everything it starts, it stops.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import free_port, tiny_spec, wait_http


def _pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    return found[-1].parent if found else None


def _as_owner(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: under root the cluster belongs to the postgres user.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def postgres():
    pg = _pg_bin()
    if pg is None:
        if os.environ.get("CI") == "true":
            pytest.fail("PostgreSQL is not installed: `bash infra/setup.sh --test` installs it "
                        "(as root) from Debian's postgresql package")
        pytest.skip("PostgreSQL is not installed (sudo apt-get install postgresql)")
    # Not pytest's tmp_path: its parents are private to root, and the server runs as postgres.
    root = Path(tempfile.mkdtemp(prefix="hf2triton-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data, sock, log = root / "data", root / "sock", root / "server.log"
    port = free_port()
    subprocess.run(_as_owner([str(pg / "initdb"), "-D", str(data), "-U", "postgres",
                              "--auth=trust", "--encoding=UTF8", "--no-sync"]),
                   check=True, capture_output=True)
    subprocess.run(_as_owner(["mkdir", str(sock)]), check=True)
    started = subprocess.run(_as_owner([
        str(pg / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "90", "-o",
        f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off", "start",
    ]), capture_output=True, text=True)
    try:
        if started.returncode != 0:
            pytest.fail(f"PostgreSQL did not start: {started.stderr}\n{log.read_text()[-2000:]}")
        subprocess.run(_as_owner([str(pg / "createdb"), "-h", "127.0.0.1", "-p", str(port),
                                  "-U", "postgres", "mlflow"]), check=True)
        yield f"postgresql://postgres@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run(_as_owner([str(pg / "pg_ctl"), "-D", str(data), "-m", "fast", "-w",
                                  "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def mlflow_on_postgres(postgres, tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow-pg")
    port = free_port()
    cmd = [str(Path(sys.executable).parent / "mlflow"), "server",
           "--backend-store-uri", postgres, "--artifacts-destination", str(root / "artifacts"),
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=180, proc=proc)
        yield f"http://127.0.0.1:{port}", postgres
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_release_records_into_mlflow_backed_by_postgresql(
        mlflow_on_postgres, tiny_bert, hf2triton_home, deploy_ports, tmp_path, monkeypatch):
    import psycopg2
    from mlflow import MlflowClient

    from flows.release import release_model
    from hf2triton.spec import load_spec

    uri, database = mlflow_on_postgres
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    summary = release_model(load_spec(tiny_spec(tmp_path / "tiny.yaml", tiny_bert, deploy_ports,
                                                image__build=False)))
    assert summary["mlflow"]["tracking_uri"] == uri
    version = summary["mlflow"]["version"]

    # The record is in PostgreSQL's tables, not in some SQLite file beside the server.
    with psycopg2.connect(database) as conn, conn.cursor() as cur:
        cur.execute("SELECT version, source FROM model_versions WHERE name = %s",
                    ("tiny-embedder",))
        rows = cur.fetchall()
        cur.execute("SELECT alias, version FROM registered_model_aliases WHERE name = %s",
                    ("tiny-embedder",))
        aliases = dict(cur.fetchall())
    assert [str(v) for v, _ in rows] == [version]
    assert rows[0][1].endswith("/triton_repository")
    assert {k: str(v) for k, v in aliases.items()} == {"candidate": version, "champion": version}

    client = MlflowClient(uri, registry_uri=uri)
    mv = client.get_model_version("tiny-embedder", version)
    assert mv.tags["smoke.grpc_min_cosine"]
    arts = {a.path for a in client.list_artifacts(mv.run_id, "triton_repository/tiny-embedder")}
    assert "triton_repository/tiny-embedder/config.pbtxt" in arts
