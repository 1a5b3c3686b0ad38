"""Operating releases with a real Prefect server: `prefect deploy` from prefect.yaml, a process
worker, `prefect deployment run --watch`, the schedule, and what the UI shows for the run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from hf2triton.orchestration.deployments import render
from tests.conftest import ROOT, free_port, tiny_spec
from tests.prefect_fixtures import (
    BIN,
    _flow_runs,
    _run,
    _start,
    _stop,
    _with_api,
    cancel_open_runs,
    screenshot,
)

pytestmark = pytest.mark.e2e  # every test here starts a server or runs a release


def test_prefect_yaml_is_rendered_from_the_release_specs():
    proc = subprocess.run(
        [str(BIN / "hf2triton"), "deployments", "render", "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    deployments = {
        d["name"]: d
        for d in __import__("yaml").safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
        if d["entrypoint"] == "flows/release.py:release_model"
    }  # not its watch's namesakes
    minilm = deployments["minilm-embedder"]
    assert (
        minilm["parameters"]["spec"]["validation"]["sentences"]
        == "releases/data/embedding-validation.txt"
    )
    assert minilm["schedules"][0]["cron"] == "0 3 * * 1"
    assert minilm["concurrency_limit"]["limit"] == 1
    # Every deployment's parameters are a spec that parses back, as the worker will parse it.
    from hf2triton.spec import ReleaseSpec, TrainingSpec, parse_spec

    everything = __import__("yaml").safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    for d in everything:
        parse_spec(
            d["parameters"]["spec"],
            ROOT,
            model=TrainingSpec if d["entrypoint"].startswith("flows/train.py") else ReleaseSpec,
        )
    # The retraining example: training on a schedule, its release triggered by each new version.
    release = next(
        d
        for d in everything
        if d["name"] == "minilm-sentiment" and d["entrypoint"] == "flows/release.py:release_model"
    )
    trigger = release["triggers"][0]
    assert trigger["expect"] == ["hf2triton.model.registered"]
    assert trigger["match"] == {
        "prefect.resource.id": "mlflow.model.minilm-sentiment-trained",
        "alias": "trained",
    }  # only the alias the spec follows
    assert (
        trigger["parameters"]["spec"]["source"]["mlflow"]["version"]
        == "{{ event.resource.version }}"
    )
    train = next(d for d in everything if d["entrypoint"] == "flows/train.py:train_classifier")
    assert train["schedules"][0]["cron"] == "0 2 * * 1"


@pytest.fixture(scope="module")
def deployed_run(prefect_server, tiny_bert):
    """Deploy the project's prefect.yaml and a tiny release, start a worker, run the tiny one."""
    env, tmp = dict(prefect_server["env"]), prefect_server["tmp"]
    _run([str(BIN / "prefect"), "--no-prompt", "deploy", "--all"], env)
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    # ONNX Runtime's fp32 alone: the deployment run is what this checks, not the gate's choice.
    spec_path = tiny_spec(
        tmp / "tiny-embedder.yaml",
        tiny_bert,
        ports,
        runtime__candidates=[{"name": "onnxruntime", "precision": "fp32"}],
    )
    prefect_file = tmp / "prefect.yaml"
    prefect_file.write_text(render([spec_path]))
    _run(
        [
            str(BIN / "prefect"),
            "--no-prompt",
            "deploy",
            "--all",
            "--prefect-file",
            str(prefect_file),
        ],
        env,
    )
    home = tmp / "hf2triton-home"
    worker_env = {**env, "HF2TRITON_HOME": str(home)}
    worker_env.pop("MLFLOW_TRACKING_URI", None)
    worker = _start(
        [str(BIN / "prefect"), "worker", "start", "--pool", "hf2triton-process", "--limit", "1"],
        worker_env,
        tmp / "worker.log",
    )
    try:
        run = subprocess.run(
            [
                str(BIN / "prefect"),
                "deployment",
                "run",
                "release-model/tiny-embedder",
                "--watch",
                "--watch-timeout",
                "900",
            ],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1000,
        )
        yield {"proc": run, "home": home, "ports": ports, **prefect_server}
    finally:
        _stop(worker)
        cancel_open_runs(env)  # the release's watch run and the schedules' next runs
        subprocess.run(
            [str(BIN / "hf2triton"), "server", "stop"],
            env={**env, "HF2TRITON_HOME": str(home)},
            capture_output=True,
        )


def test_deployment_run_releases_and_serves(deployed_run):
    proc = deployed_run["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Completed" in proc.stdout + proc.stderr
    from mlflow import MlflowClient

    uri = f"sqlite:///{deployed_run['home'] / 'mlflow.db'}"
    champion = MlflowClient(uri, registry_uri=uri).get_model_version_by_alias(
        "tiny-embedder", "champion"
    )
    assert str(champion.version) == "1"
    from tests.served import embed_remote

    emb, _ = embed_remote(
        "grpc",
        f"127.0.0.1:{deployed_run['ports']['grpc_port']}",
        "tiny-embedder",
        "1",
        ["the quick brown fox"],
    )
    assert emb.shape == (1, 32) and np.isfinite(emb).all()
    # The release started its watch deployment for the rollback window (docs/watch.md).
    _, watches = _with_api(
        deployed_run["env"],
        _flow_runs,
        deployed_run["env"],
        name="tiny-embedder",
        flow="watch-release",
    )
    assert watches and watches[0].parameters["duration_s"] == 600


def test_schedule_creates_a_scheduled_run(deployed_run):
    import time

    deadline = time.monotonic() + 60
    while True:
        deployment, runs = _with_api(
            deployed_run["env"], _flow_runs, deployed_run["env"], name="minilm-embedder"
        )
        scheduled = [r for r in runs if r.state and r.state.type.value == "SCHEDULED"]
        if scheduled or time.monotonic() > deadline:
            break
        time.sleep(2)
    # prefect.yaml's `concurrency_limit: {limit: 1, collision_strategy: ENQUEUE}`: one run of a
    # release at a time, a second queued behind it. The server keeps the limit on the deployment
    # or, as Prefect 3 does, on a global concurrency limit of its own.
    limit = deployment.global_concurrency_limit
    assert (limit.limit if limit else deployment.concurrency_limit) == 1
    options = deployment.concurrency_options
    assert options is not None and options.collision_strategy.value == "ENQUEUE"
    assert scheduled, "the cron schedule produced no scheduled run"
    assert scheduled[0].expected_start_time.weekday() == 0  # Mondays
    assert scheduled[0].expected_start_time.hour == 3


def test_run_page_shows_the_release_artifacts(deployed_run, tmp_path):
    _, runs = _with_api(deployed_run["env"], _flow_runs, deployed_run["env"], name="tiny-embedder")
    run = next(r for r in runs if r.state and r.state.type.value == "COMPLETED")

    async def artifacts():
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
            )

    found = {a.key: a for a in _with_api(deployed_run["env"], artifacts)}
    assert {"tiny-embedder-report", "tiny-embedder-accuracy"} <= set(found)
    report = found["tiny-embedder-report"].data
    assert "MLflow tiny-embedder version 1" in report and "fixtures/tiny-bert" in report
    table = found["tiny-embedder-accuracy"].data
    rows = json.loads(table) if isinstance(table, str) else table
    assert any(r["verdict"] == "ships" for r in rows)

    shot = screenshot(
        f"{deployed_run['ui']}/runs/flow-run/{run.id}", tmp_path / "flow-run.png", tmp_path
    )
    assert shot.is_file() and shot.stat().st_size > 20_000  # a rendered page, not a blank one
    if os.environ.get("HF2TRITON_SCREENSHOT_TO"):  # to look at it: set a destination path
        shutil.copy(shot, os.environ["HF2TRITON_SCREENSHOT_TO"])
