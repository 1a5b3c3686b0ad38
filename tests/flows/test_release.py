"""End to end: `hf2triton release` on the real all-MiniLM-L6-v2 model, against a real MLflow
server and a real local Triton server, then the endpoint is queried like a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hf2triton.kinds.embedding import TorchEmbedder, cosine_rows, resolve_embedding_config
from tests.conftest import ROOT, free_port, graph_file, run_mlflow_server, write_spec
from tests.served import read_sentences

pytestmark = pytest.mark.e2e
HF2TRITON = str(Path(sys.executable).parent / "hf2triton")
MODEL = "minilm-embedder"


class Release:
    def __init__(self, home: Path, mlflow_uri: str, spec: Path, ports: dict[str, int]):
        self.home, self.mlflow_uri, self.spec, self.ports = home, mlflow_uri, spec, ports
        self.env = {**os.environ, "HF2TRITON_HOME": str(home), "MLFLOW_TRACKING_URI": mlflow_uri}
        self.env.pop("PREFECT_API_URL", None)  # the CLI runs without a Prefect server

    def run(self, spec: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [HF2TRITON, "release", str(spec or self.spec)],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1200,
        )

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [HF2TRITON, *args], env=self.env, capture_output=True, text=True, timeout=120
        )


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """This module's own MLflow server: its assertions count every version of the model."""
    yield from run_mlflow_server(tmp_path_factory.mktemp("e2e-mlflow"))


@pytest.fixture(scope="module")
def release(tmp_path_factory, mlflow_server):
    tmp = tmp_path_factory.mktemp("e2e")
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    spec = write_spec(tmp / "minilm.yaml", **{f"deploy__{k}": v for k, v in ports.items()})
    rel = Release(tmp / "home", mlflow_server, spec, ports)
    rel.first = rel.run()
    yield rel
    rel.cli("server", "stop")


def _summary(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout must be one JSON line, got {proc.stdout!r}"
    return json.loads(lines[0])


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def test_release_summary_names_version_metrics_and_endpoints(release):
    summary = _summary(release.first)
    assert summary["release"] == MODEL
    assert summary["mlflow"]["model_name"] == MODEL and summary["mlflow"]["version"] == "1"
    assert summary["metrics"]["min_cosine"] >= 0.99
    assert summary["endpoint"]["grpc"] == f"127.0.0.1:{release.ports['grpc_port']}"
    assert (
        f":{release.ports['http_port']}/v2/models/{MODEL}/versions/1/infer"
        in summary["endpoint"]["http"]
    )
    # Each long step's time, and what the work folder keeps once the release serves.
    assert set(summary["seconds"]) == {"export", "quantize", "validate"}
    assert summary["seconds"]["validate"] > 0
    work = sum(p.stat().st_size for p in (release.home / "work" / MODEL).rglob("*") if p.is_file())
    assert 0 < summary["work"]["bytes"] <= work and summary["work"]["removed_bytes"] >= 0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_served_embeddings_match_pytorch_on_unseen_sentences(release, minilm_dir, protocol):
    from tests.served import embed_remote

    _summary(release.first)
    heldout = read_sentences(ROOT / "tests" / "data" / "heldout-sentences.txt")
    validation = set(read_sentences(ROOT / "releases" / "data" / "embedding-validation.txt"))
    assert not validation & set(heldout), "the held-out set must be unseen by the gate"
    reference = TorchEmbedder(minilm_dir, resolve_embedding_config(minilm_dir)).embed(heldout)
    port = release.ports[f"{protocol}_port"]
    served, _ = embed_remote(protocol, f"127.0.0.1:{port}", MODEL, "1", heldout)
    cos = cosine_rows(reference, served)
    worst = int(np.argmin(cos))
    assert cos.min() >= 0.99, f"{heldout[worst][:60]!r} served at cosine {cos[worst]:.4f}"


def test_the_openai_sdk_gets_the_served_embeddings_from_the_summarys_api(release):
    """What the issue's user does after the README's command: the openai SDK on the summary's
    endpoint.openai returns Triton's own embeddings (not a copy of the model: the same server)."""
    import openai

    from tests.served import embed_remote

    summary = _summary(release.first)
    base = summary["endpoint"]["openai"]
    assert base.startswith("http://127.0.0.1:") and base.endswith("/v1")
    texts = read_sentences(ROOT / "tests" / "data" / "heldout-sentences.txt")[:16]
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    got = client.embeddings.create(model=MODEL, input=texts)
    assert got.model == MODEL and [d.index for d in got.data] == list(range(len(texts)))
    served, _ = embed_remote("grpc", f"127.0.0.1:{release.ports['grpc_port']}", MODEL, "1", texts)
    cos = cosine_rows(np.array([d.embedding for d in got.data]), served)
    assert cos.min() >= 0.9999, f"{texts[int(np.argmin(cos))][:60]!r} at cosine {cos.min()}"
    assert got.usage.prompt_tokens > len(texts)  # every text's tokens, not one per text


# What the default release printed before this was cleaned up, and nothing its user can act on.
LIBRARY_NOISE = (
    "WARNING",
    "Warning",
    "deprecated",
    "Opset",
    "accelerate",
    "pre-processing",
    "Traceback",
)


def test_the_release_log_carries_no_warning_its_user_cannot_act_on(release):
    _summary(release.first)
    noisy = [ln for ln in release.first.stderr.splitlines() if any(w in ln for w in LIBRARY_NOISE)]
    assert not noisy, "\n".join(noisy[:10])
    assert "validate: candidate 1 of" in release.first.stderr  # long steps show progress


def test_release_record_in_mlflow(release):
    _summary(release.first)
    client = _client(release.mlflow_uri)
    mv = client.get_model_version_by_alias(MODEL, "champion")
    assert mv.version == "1"
    assert client.get_model_version_by_alias(MODEL, "candidate").version == "1"
    tags = mv.tags
    assert tags["source_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert len(tags["content_hash"]) == 64
    assert len(tags["sha256.model.safetensors"]) == 64 and "sha256.tokenizer.json" in tags
    assert float(tags["smoke.grpc_min_cosine"]) >= 0.99
    run = client.get_run(mv.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["versions.torch"].startswith("2.13")
    assert run.data.params["export.opset"] == "18"
    assert run.data.metrics["min_cosine"] >= 0.99
    assert run.data.metrics["onnx_int8_bytes"] < run.data.metrics["onnx_fp32_bytes"]
    top = {a.path for a in client.list_artifacts(mv.run_id)}
    assert {"triton_repository", "model", "validation_report.json"} <= top
    # The export's configuration and tokenizer, not its fp32 graph (registry.log_export: false):
    # the served graph is in triton_repository/ once.
    export = {a.path for a in client.list_artifacts(mv.run_id, "model")}
    assert {"model/config.json", "model/tokenizer.json"} <= export, export
    assert not [p for p in export if p.endswith(".onnx")], export
    repo = {a.path for a in client.list_artifacts(mv.run_id, f"triton_repository/{MODEL}/1")}
    [served] = release.home.glob(f"triton/models/{MODEL}/*/serving.json")
    assert f"triton_repository/{MODEL}/1/{graph_file(served.parent)}" in repo
    assert f"triton_repository/{MODEL}/1/tokenizer.json" in repo
    # Every file Triton serves from the version directory, whichever runtime's graph shipped
    # (model.onnx, or OpenVINO's model.xml and model.bin), has its sha256 in the version's tags.
    from hf2triton.util.workspace import sha256_file

    served_files = [p for p in served.parent.iterdir() if p.is_file()]
    assert graph_file(served.parent) in {p.name for p in served_files}
    for path in served_files:
        assert tags[f"sha256.triton.{MODEL}/1/{path.name}"] == sha256_file(path), path.name


def test_second_run_reuses_steps_and_keeps_one_version(release):
    first = _summary(release.first)
    second_proc = release.run()
    second = _summary(second_proc)
    assert second["mlflow"]["version"] == first["mlflow"]["version"] == "1"
    assert {"export", "quantize", "validate", "register"} <= set(second["reused_steps"])
    for step in ("export", "quantize", "validate"):
        assert f"{step}: reused" in second_proc.stderr
    versions = _client(release.mlflow_uri).search_model_versions(f"name = '{MODEL}'")
    assert [v.version for v in versions] == ["1"]


def test_failed_gate_stops_before_registration_and_old_version_serves(release, tmp_path):
    from tests.served import embed_remote

    _summary(release.first)
    sentences = tmp_path / "short.txt"
    sentences.write_text("thank you\nok\nThe weather is nice today.\nblood pressure\n")
    spec = write_spec(
        tmp_path / "strict.yaml",
        validation__sentences=str(sentences),
        quantization__fallback_to_fp32=False,
        embedding__thresholds__min_cosine=0.999,
        # ONNX Runtime's int8 alone: the refusal is what this checks, not OpenVINO's calibration
        runtime__candidates=[{"name": "onnxruntime", "precision": "fp32"}],
        **{f"deploy__{k}": v for k, v in release.ports.items()},
    )
    proc = release.run(spec)
    assert proc.returncode == 1
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("hf2triton: error: [ACCURACY_GATE_FAILED]")
    assert "min_cosine" in error and "short by" in error and "< 0.999" in error
    assert "Task run 'register" not in proc.stderr and "Task run 'deploy" not in proc.stderr
    versions = _client(release.mlflow_uri).search_model_versions(f"name = '{MODEL}'")
    assert [v.version for v in versions] == ["1"]
    emb, _ = embed_remote(
        "grpc", f"127.0.0.1:{release.ports['grpc_port']}", MODEL, "1", ["still serving"]
    )
    assert emb.shape == (1, 384)


def test_a_worse_embedder_is_refused_against_the_serving_champion(release, tiny_bert, tmp_path):
    """With a retrieval set (query, passage, relevance), the gate scores the candidate and the
    serving champion (version 1, MiniLM, from its own served files) by nDCG@10 on it: a
    random-weight model that matches its own PyTorch original perfectly is still refused."""
    from tests.served import embed_remote

    _summary(release.first)
    spec = write_spec(
        tmp_path / "worse.yaml",
        source__path=str(tiny_bert),
        source__package=None,
        source__subdir=None,
        source__model_id="fixtures/tiny-bert",
        embedding__retrieval=str(ROOT / "releases" / "data" / "retrieval-sample.tsv"),
        **{f"deploy__{k}": v for k, v in release.ports.items()},
    )
    proc = release.run(spec)
    assert proc.returncode == 1, proc.stderr[-2000:]
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("hf2triton: error: [ACCURACY_GATE_FAILED]"), error
    assert "ndcg_at_10" in error and "the serving champion's (version 1:" in error, error
    assert "[MLflow: " in error, error  # MLflow's own model validation made the call
    champion_score = float(error.split("the serving champion's (version 1: ")[1].split(")")[0])
    assert champion_score >= 0.8, error  # MiniLM finds the right passage
    assert "validate: the serving champion, version 1: ndcg_at_10" in proc.stderr
    versions = _client(release.mlflow_uri).search_model_versions(f"name = '{MODEL}'")
    assert [v.version for v in versions] == ["1"]
    emb, _ = embed_remote(
        "grpc", f"127.0.0.1:{release.ports['grpc_port']}", MODEL, "1", ["still serving"]
    )
    assert emb.shape == (1, 384)


def test_server_status_lists_the_served_version(release):
    _summary(release.first)
    proc = release.cli("server", "status")
    assert proc.returncode == 0
    info = json.loads(proc.stdout)
    assert info["ready"] and info["http_port"] == release.ports["http_port"]
    assert {"name": MODEL, "version": "1", "state": "READY"} in info["models"]


def test_bad_spec_fails_with_one_line_naming_the_key(release, tmp_path):
    spec = write_spec(tmp_path / "bad.yaml", name="Bad Name", colour="blue")
    proc = release.run(spec)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "'name' = 'Bad Name'" in lines[0] and "unknown key 'colour'" in lines[0]
