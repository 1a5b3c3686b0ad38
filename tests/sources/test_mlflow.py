"""An `mlflow` source on a registry that demands a password: a real `mlflow server` with MLflow's
basic-auth app. The credentials come from the environment or from a Prefect block, never from
the spec, and a block's never enter this process's environment; without them the release fails
in one line that says which credentials to set, and it is not retried as if the server were
down."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf2triton.clients.credentials import MlflowCredentials
from hf2triton.errors import SourceError, SpecError
from hf2triton.sources.mlflow import MlflowSource, MlflowSourceSpec
from tests.conftest import MLFLOW_SERVER_ENV, free_port, wait_http

pytestmark = pytest.mark.e2e  # every test here starts a server or runs a release

ADMIN, ADMIN_PASSWORD = "admin", "test-only-Admin-pw-7"  # the bootstrap admin (test only)
MODEL = "auth-tiny"


def _fetch(spec, uri):
    return MlflowSource(mlflow=spec).fetch(uri)


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory, tiny_bert):
    """An MLflow server with basic auth, holding one registered version (alias `trained`) of
    the tiny BERT logged as a plain Hugging Face directory (artifacts, no MLflow flavour)."""
    tmp = tmp_path_factory.mktemp("mlflow-auth")
    (tmp / "basic_auth.ini").write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{tmp / 'auth.db'}\n"
        f"admin_username = {ADMIN}\nadmin_password = {ADMIN_PASSWORD}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    port = free_port()
    env = {
        **os.environ,
        **MLFLOW_SERVER_ENV,
        "MLFLOW_AUTH_CONFIG_PATH": str(tmp / "basic_auth.ini"),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-only-csrf-key",
    }
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        env.pop(key, None)
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--app-name",
            "basic-auth",
            "--backend-store-uri",
            f"sqlite:///{tmp / 'mlflow.db'}",
            "--artifacts-destination",
            str(tmp / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env=env,
        cwd=tmp,
        stdout=open(tmp / "server.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{uri}/health", timeout=120, proc=server)
        publish = subprocess.run(
            [
                sys.executable,
                "-c",
                f"""
import mlflow
from mlflow import MlflowClient
mlflow.set_tracking_uri({uri!r})
mlflow.set_experiment("training")
with mlflow.start_run() as run:
    mlflow.log_artifacts({str(tiny_bert)!r}, "model")
client = MlflowClient({uri!r})
client.create_registered_model({MODEL!r})
mv = client.create_model_version({MODEL!r}, source=f"{{run.info.artifact_uri}}/model",
                                 run_id=run.info.run_id)
client.set_registered_model_alias({MODEL!r}, "trained", mv.version)
""",
            ],
            env={
                **env,
                "MLFLOW_TRACKING_USERNAME": ADMIN,
                "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD,
            },
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert publish.returncode == 0, publish.stderr[-3000:]
        yield uri
    finally:
        server.terminate()
        server.wait(30)


@pytest.fixture()
def no_mlflow_env(monkeypatch, hf2triton_home):
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(key, raising=False)


def test_without_credentials_the_source_fails_in_one_line_naming_what_to_set(
    auth_registry, no_mlflow_env
):
    spec = MlflowSourceSpec(model=MODEL, alias="trained", tracking_uri=auth_registry)
    with pytest.raises(SourceError) as caught:
        _fetch(spec, auth_registry)
    message = str(caught.value)
    assert "MLFLOW_TRACKING_USERNAME" in message and "credentials_block" in message, message
    assert not caught.value.retryable  # a refused password is not a server that is down


def test_credentials_from_the_environment(auth_registry, no_mlflow_env, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    got = _fetch(MlflowSourceSpec(model=MODEL, alias="trained"), auth_registry)
    assert got["revision"] == "1" and (Path(got["model_dir"]) / "config.json").is_file()
    assert got["registry"]["model"] == MODEL and got["registry"]["uri"] == auth_registry


def test_credentials_from_a_prefect_block_never_enter_this_process_environment(
    auth_registry, no_mlflow_env, environ_writes
):
    MlflowCredentials(username=ADMIN, password=ADMIN_PASSWORD).save(
        "test-mlflow-auth", overwrite=True
    )
    spec = MlflowSourceSpec(
        model=MODEL, version="1", tracking_uri=auth_registry, credentials_block="test-mlflow-auth"
    )
    got = _fetch(spec, "http://127.0.0.1:1")
    # The server demands a password and this process's environment has none: the block's
    # reached MLflow, and at no moment of the download was it written into os.environ.
    assert got["revision"] == "1" and got["content_hash"]
    assert not [
        k for k, v in environ_writes if ADMIN_PASSWORD in v or k.startswith("MLFLOW_TRACKING_")
    ], environ_writes
    assert "MLFLOW_TRACKING_PASSWORD" not in os.environ
    assert ADMIN_PASSWORD not in repr(got)
    with pytest.raises(SpecError, match="credentials_block 'no-such-block': no saved"):
        _fetch(spec.model_copy(update={"credentials_block": "no-such-block"}), auth_registry)


def test_a_block_with_a_token_replaces_the_environment_credentials(
    auth_registry, no_mlflow_env, monkeypatch
):
    """Another registry's user and password (e.g. the release's own MLflow) must not go to the
    source's registry beside the block's token: MLflow prefers basic auth when both are set.
    Here the environment's are the ones this server takes, so the fetch succeeding would mean
    they went along; the block's token alone is refused."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    MlflowCredentials(token="source-token").save("test-mlflow-token", overwrite=True)
    spec = MlflowSourceSpec(
        model=MODEL,
        alias="trained",
        tracking_uri=auth_registry,
        credentials_block="test-mlflow-token",
    )
    with pytest.raises(SourceError, match="refused the credentials") as caught:
        _fetch(spec, auth_registry)
    assert "source-token" not in str(caught.value) and ADMIN_PASSWORD not in str(caught.value)
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == ADMIN_PASSWORD  # this process's, untouched
    assert "MLFLOW_TRACKING_TOKEN" not in os.environ


def test_a_password_in_the_tracking_uri_is_refused_without_being_echoed(tmp_path):
    import yaml

    from hf2triton.spec import load_spec
    from tests.conftest import ROOT

    spec = yaml.safe_load((ROOT / "releases" / "minilm-sentiment.yaml").read_text())
    spec["source"]["mlflow"]["tracking_uri"] = "https://ci:s3cret-pw@mlflow.internal:5000"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    message = str(caught.value)
    assert "source.mlflow.tracking_uri" in message and "credentials_block" in message
    assert "s3cret-pw" not in message and "https://mlflow.internal:5000" in message


@pytest.mark.parametrize("candidate, passes", [(0.7, True), (0.75, True), (0.6999, False)])
def test_mlflow_validation_passes_a_candidate_exactly_at_the_champion_less_max_drop(
    candidate, passes
):
    from hf2triton.release.champion import mlflow_verdict

    verdict = mlflow_verdict("accuracy", candidate, 0.8, 0.1)  # 0.8 - 0.1 is 0.7000000000000001
    assert (verdict is None) == passes, verdict


def test_a_tracking_uri_without_its_scheme_is_refused_up_front():
    """`mlflow.internal:5000` would reach MLflow only at fetch, as an unsupported store URI;
    the spec says which key and what a tracking URI looks like."""
    with pytest.raises(ValueError, match="is a host and port without its scheme: write the "):
        MlflowSourceSpec(model=MODEL, alias="trained", tracking_uri="mlflow.internal:5000")
    for uri in ("http://mlflow.internal:5000", "sqlite:///m.db", "databricks", "/srv/mlruns", None):
        assert MlflowSourceSpec(model=MODEL, alias="trained", tracking_uri=uri).tracking_uri == uri
