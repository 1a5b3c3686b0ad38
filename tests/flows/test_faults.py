"""Faults and bad input through the real CLI: each bad input gives a one-line error and a
non-zero exit, registers nothing, deploys nothing and leaves the serving version alone; faults
during a release (MLflow down, the process killed) leave nothing half-finished that passes for
finished; planted secrets reach no log, artifact, MLflow record or server environment."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from hf2triton.util.workspace import DONE_FILE
from tests.conftest import MLFLOW_SERVER_ENV, ROOT, free_port, run_cli, tiny_spec, wait_http

HF2TRITON = str(Path(sys.executable).parent / "hf2triton")


def _cli(args: list[str], env: dict | None = None, timeout: float = 600):
    return run_cli([HF2TRITON, *args], timeout, env=env or _api_env(dict(os.environ)), cwd=ROOT)


def _api_env(env: dict) -> dict:
    """`env` with this session's Prefect test API, which is up already, as a user's runs go to
    their Prefect server: a release run would otherwise start and stop Prefect's temporary API
    (about 30 s of a tiny release here). tests/cli/test_first_run.py and
    tests/flows/test_release.py release with the temporary API."""
    from prefect.settings import PREFECT_API_URL

    return {**env, "PREFECT_API_URL": PREFECT_API_URL.value()}


def _error_line(proc) -> str:
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert lines, "no error printed"
    assert lines[-1].startswith("hf2triton: error:"), proc.stderr[-3000:]
    assert sum(line.startswith("hf2triton: error:") for line in lines) == 1
    return lines[-1]


def _mlflow_versions(home: Path) -> list[tuple[str, str]]:
    from mlflow import MlflowClient

    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    return sorted((m.name, str(m.version)) for m in client.search_model_versions())


def _served(rel) -> tuple[list[str], np.ndarray]:
    import tritonclient.http as httpclient

    from tests.served import embed_remote, serving_versions

    client = httpclient.InferenceServerClient(url=rel.http_url)
    emb, _ = embed_remote("grpc", rel.grpc_url, rel.model, "", ["the quick brown fox"])
    return serving_versions(client, rel.model), emb


# --- bad input to the pipeline -------------------------------------------------------------


def _broken_model(kind: str, tiny_bert: Path, tmp: Path) -> Path:
    model = tmp / f"model-{kind}"
    shutil.copytree(tiny_bert, model)
    if kind == "missing-weights":
        (model / "model.safetensors").unlink()
    elif kind == "corrupt-weights":
        data = (model / "model.safetensors").read_bytes()
        (model / "model.safetensors").write_bytes(data[: len(data) // 3])
    elif kind == "no-tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (model / name).unlink(missing_ok=True)
    elif kind == "config-not-json":
        (model / "config.json").write_text('{"model_type": "bert", architectures: [}')
    elif kind == "unsupported-architecture":
        from transformers import ErnieConfig, ErnieModel

        shutil.rmtree(model)
        ErnieModel(
            ErnieConfig(
                vocab_size=200,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                max_position_embeddings=64,
            )
        ).save_pretrained(model)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copyfile(tiny_bert / name, model / name)
    return model


BAD_MODELS = {
    "missing-weights": "has no model weights",
    "corrupt-weights": "corrupt or truncated",
    "no-tokenizer": "has no tokenizer",
    "config-not-json": "config.json is not valid JSON",
    "unsupported-architecture": "cannot export",
}


@pytest.mark.parametrize("kind", BAD_MODELS)
def test_bad_model_directory_is_refused_and_serving_untouched(
    tiny_release, tiny_bert, tmp_path, kind
):
    rel = tiny_release
    before_versions, before = _served(rel), _mlflow_versions(rel.home)
    model = _broken_model(kind, tiny_bert, tmp_path)
    spec = tiny_spec(
        tmp_path / "bad.yaml", model, rel.ports, name="tiny-bad", registry__model_name="tiny-bad"
    )
    proc = _cli(["release", str(spec)])
    assert proc.returncode == 1
    line = _error_line(proc)
    assert BAD_MODELS[kind] in line and "[UNEXPECTED]" not in line
    assert _mlflow_versions(rel.home) == before
    after_versions, after = _served(rel)
    assert after_versions == before_versions[0] and np.allclose(after, before_versions[1])


BAD_SPECS = {
    "unknown task": ({"task": "summarization"}, "'task' = 'summarization'"),
    "missing field": ({"registry": None}, "missing key 'registry'"),
    "name with a path separator": ({"name": "team/model"}, "'name' = 'team/model'"),
    "name with ..": ({"name": ".."}, "'name' = '..'"),
    "upper-case name": ({"name": "MyModel"}, "'name' = 'MyModel'"),
    "name with a space": (
        {"registry": {"model_name": "my model"}},
        "'registry.model_name' = 'my model'",
    ),
    "threshold above 1": (
        {"embedding": {"thresholds": {"min_cosine": 1.5}}},
        "'embedding.thresholds.min_cosine' = 1.5",
    ),
    "unknown key": ({"deploy": {"colour": "blue"}}, "unknown key 'deploy.colour'"),
}


@pytest.mark.parametrize("case", BAD_SPECS)
def test_bad_spec_is_refused_with_the_key_and_value(tiny_release, tiny_bert, tmp_path, case):
    rel = tiny_release
    change, expected = BAD_SPECS[case]
    spec_path = tiny_spec(tmp_path / "spec.yaml", tiny_bert, rel.ports)
    spec = yaml.safe_load(spec_path.read_text())
    for key, value in change.items():
        if value is None:
            spec.pop(key)
        elif isinstance(value, dict):
            node = spec.setdefault(key, {})
            for k, v in value.items():
                if isinstance(v, dict):
                    node.setdefault(k, {}).update(v)
                else:
                    node[k] = v
        else:
            spec[key] = value
    spec_path.write_text(yaml.safe_dump(spec))
    before = _mlflow_versions(rel.home)
    proc = _cli(["release", str(spec_path)])
    assert proc.returncode == 2
    assert expected in _error_line(proc)
    assert _mlflow_versions(rel.home) == before


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "holds no sentences"),
        (b"\n   \n", "holds no sentences"),
        (b"caf\xe9 latin-1 text\n", "is not UTF-8 text"),
    ],
    ids=["empty", "blank lines", "not utf-8"],
)
def test_bad_validation_file_is_refused(tiny_release, tiny_bert, tmp_path, content, expected):
    rel = tiny_release
    sentences = tmp_path / "sentences.txt"
    sentences.write_bytes(content)
    spec = tiny_spec(tmp_path / "spec.yaml", tiny_bert, rel.ports)
    data = yaml.safe_load(spec.read_text())
    data["validation"]["sentences"] = str(sentences)
    spec.write_text(yaml.safe_dump(data))
    before = _mlflow_versions(rel.home)
    proc = _cli(["release", str(spec)])
    assert proc.returncode == 2  # refused before any step starts
    assert expected in _error_line(proc) and str(sentences) in _error_line(proc)
    assert _mlflow_versions(rel.home) == before


# --- faults during a release ---------------------------------------------------------------


def _fresh_env(home: Path, *, prefect_api: bool = True, **extra) -> dict:
    """A release's environment in its own hf2triton home, its flow runs on this session's
    Prefect test API (`_api_env`), or with `prefect_api=False` on the temporary API it starts."""
    env = {**os.environ, "HF2TRITON_HOME": str(home), "HF2TRITON_RETRY_DELAYS": "0.5,0.5", **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PREFECT_API_URL", None)
    env.update(extra)
    return _api_env(env) if prefect_api else env


@pytest.mark.e2e
def test_mlflow_down_at_registration_then_rerun_registers_once(tiny_bert, tmp_path):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    spec = tiny_spec(tmp_path / "spec.yaml", tiny_bert, ports)
    env = _fresh_env(tmp_path / "home", MLFLOW_TRACKING_URI=uri)
    try:
        down = _cli(["release", str(spec)], env)
        assert down.returncode == 1
        line = _error_line(down)
        assert "[SERVICE_UNAVAILABLE]" in line and uri in line
        assert down.stderr.count("Retrying") >= 2 or down.stderr.count("retry") >= 2
        assert "Task run 'deploy" not in down.stderr

        server = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "mlflow"),
                "server",
                "--backend-store-uri",
                f"sqlite:///{tmp_path / 'mlflow.db'}",
                "--artifacts-destination",
                str(tmp_path / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=open(tmp_path / "mlflow.log", "wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **MLFLOW_SERVER_ENV},
            start_new_session=True,
        )
        try:
            wait_http(f"{uri}/health", timeout=120, proc=server)
            up = _cli(["release", str(spec)], env)
            assert up.returncode == 0, up.stderr[-3000:]
            assert json.loads(up.stdout)["mlflow"]["version"] == "1"
            again = _cli(["release", str(spec)], env)
            assert json.loads(again.stdout)["mlflow"]["version"] == "1"
            from mlflow import MlflowClient

            versions = MlflowClient(uri, registry_uri=uri).search_model_versions(
                "name = 'tiny-embedder'"
            )
            assert len(versions) == 1
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
    finally:
        _cli(["server", "stop"], env)


@pytest.mark.e2e
def test_killed_mid_export_leaves_nothing_that_looks_finished_and_rerun_completes(
    tiny_bert, tmp_path
):
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    spec = tiny_spec(
        tmp_path / "spec.yaml",
        tiny_bert,
        ports,
        name="tiny-killed",
        registry__model_name="tiny-killed",
    )
    home = tmp_path / "home"
    env = _fresh_env(home)
    export_dir = home / "work" / "tiny-killed" / "export"
    proc = subprocess.Popen(
        [HF2TRITON, "release", str(spec)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if export_dir.is_dir() and any(p.name.endswith(".tmp") for p in export_dir.iterdir()):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the release ended before the export was under way"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        finished = [p for p in export_dir.iterdir() if not p.name.startswith(".")]
        assert all((p / DONE_FILE).is_file() for p in finished)  # none half-written
        assert not finished, "the export was killed before it could finish"
        rerun = _cli(["release", str(spec)], env)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        summary = json.loads(rerun.stdout)
        assert "export" not in summary["reused_steps"]
        assert summary["mlflow"]["version"] == "1"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _cli(["server", "stop"], env)


# --- secrets -------------------------------------------------------------------------------

SECRETS = {
    "HF_TOKEN": "hf_plantedSecretToken0123456789",
    "HF2TRITON_REGISTRY_PASSWORD": "registry-planted-password-4242",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-planted-password-1717",
}


@pytest.mark.e2e
def test_planted_secrets_reach_no_log_artifact_record_or_server(tiny_bert, tmp_path):
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    spec = tiny_spec(
        tmp_path / "spec.yaml",
        tiny_bert,
        ports,
        name="tiny-secrets",
        registry__model_name="tiny-secrets",
    )
    home = tmp_path / "home"
    env = _fresh_env(home, prefect_api=False, **SECRETS)  # its Prefect API started by the run
    try:
        proc = _cli(["release", str(spec)], env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs = proc.stdout + proc.stderr
        leaks = [k for k, v in SECRETS.items() if v in outputs]
        assert not leaks, f"secrets in the CLI output: {leaks}"
        for path in home.rglob("*"):  # MLflow db and artifacts, work dirs, Triton log, reports
            if path.is_file() and path.stat().st_size < 200_000_000:
                data = path.read_bytes()
                leaked = [k for k, v in SECRETS.items() if v.encode() in data]
                assert not leaked, f"{leaked} found in {path}"
        from hf2triton.targets import triton_local

        os.environ["HF2TRITON_HOME"], saved = str(home), os.environ.get("HF2TRITON_HOME")
        try:
            state = triton_local.read_state()
        finally:
            if saved is None:
                os.environ.pop("HF2TRITON_HOME")
            else:
                os.environ["HF2TRITON_HOME"] = saved
        assert state is not None
        environ = Path(f"/proc/{state.pid}/environ").read_bytes()
        assert not [k for k, v in SECRETS.items() if v.encode() in environ], (
            "the Triton process was given a secret it does not need"
        )
    finally:
        _cli(["server", "stop"], env)
