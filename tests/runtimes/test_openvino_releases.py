"""Every model kind released with the OpenVINO runtime through a real tritonserver: the gate ran
the candidate on OpenVINO, serving.json pins it, and what the endpoint answers equals what the
gate's in-process serving core answers on the same files and settings (the smoke test scored
those answers with the gate's limits). Tiny random-weight models, built once per module."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hf2triton import serving
from hf2triton.clients.triton import inference
from hf2triton.release.gate import answer_in_batches
from hf2triton.spec import kind_for
from tests.conftest import free_port, tiny_spec
from tests.tiny_models import (
    SEQ2SEQ_CORPUS,
    build_tiny_bert,
    build_tiny_classifier,
    build_tiny_cross_encoder,
    build_tiny_m2m100,
    rerank_pairs,
)

pytestmark = pytest.mark.e2e  # every test here starts a server or runs a release

OPENVINO = [{"name": "openvino", "precision": "fp32"}]


def _embedding(tmp: Path) -> tuple[Path, dict]:
    return build_tiny_bert(tmp / "model"), {}


def _classification(tmp: Path) -> tuple[Path, dict]:
    return build_tiny_classifier(tmp / "model"), {
        "task": "text-classification",
        "embedding": None,
        "embedding__thresholds": None,
    }


def _reranking(tmp: Path) -> tuple[Path, dict]:
    pairs = tmp / "pairs.tsv"
    pairs.write_text("".join(f"{q}\t{p}\n" for q, p in rerank_pairs()), encoding="utf-8")
    return build_tiny_cross_encoder(tmp / "model"), {
        "task": "text-ranking",
        "embedding": None,
        "embedding__thresholds": None,
        "validation__sentences": str(pairs),
        "validation__smoke_sentences": 6,
    }


def _translation(tmp: Path) -> tuple[Path, dict]:
    sentences = tmp / "sentences.txt"
    sentences.write_text("\n".join(SEQ2SEQ_CORPUS) + "\n", encoding="utf-8")
    return build_tiny_m2m100(tmp / "model"), {
        "task": "translation",
        "embedding": None,
        "embedding__thresholds": None,
        "generation": {"target_lang": "sw", "max_new_tokens": 12, "num_beams": 1},
        "validation__sentences": str(sentences),
        "validation__smoke_sentences": 8,
    }


KINDS = {
    "embedding": _embedding,
    "classification": _classification,
    "reranking": _reranking,
    "translation": _translation,
}


def _same(kind_name: str, served: object, in_process: object) -> None:
    if kind_name == "embedding":
        assert np.abs(np.asarray(served) - np.asarray(in_process)).max() < 1e-5
    elif kind_name == "classification":
        assert served["labels"] == in_process["labels"]
        assert np.abs(served["probs"] - in_process["probs"]).max() < 1e-5
    elif kind_name == "reranking":
        for a, b in zip(served, in_process):
            assert np.abs(np.asarray(a) - np.asarray(b)).max() < 1e-5
    else:
        assert served == in_process


@pytest.mark.e2e
@pytest.mark.parametrize("kind_name", list(KINDS))
def test_every_kind_releases_and_serves_on_openvino(kind_name, tmp_path, monkeypatch):
    from hf2triton.flows.release import release_model
    from hf2triton.spec import load_spec
    from hf2triton.targets import triton_local

    model_dir, overrides = KINDS[kind_name](tmp_path)
    name = f"ov-{kind_name}"
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    spec_path = tiny_spec(
        tmp_path / "spec.yaml",
        model_dir,
        ports,
        name=name,
        registry__model_name=name,
        runtime__candidates=OPENVINO,
        **overrides,
    )
    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = load_spec(spec_path)
    try:
        summary = release_model(spec)
        version = summary["endpoint"]["version"]
        assert summary["variant"].endswith("on openvino fp32"), summary["variant"]
        version_dir = tmp_path / "home" / "triton" / "models" / name / version
        settings = json.loads((version_dir / serving.SERVING_FILE).read_text())
        assert settings["runtime"]["name"] == "openvino"
        assert settings["runtime"]["precision"] == "fp32"  # pinned, never left to OpenVINO
        # The smoke test scored the served answers against the judged ones (summary metrics).
        kind = kind_for(spec)
        assert {f"smoke_{k}" for k in kind.agreement_limits(0.0)} <= set(summary["metrics"])
        # What the endpoint answers is what the gate's serving core answers, request by request.
        reference = json.loads(
            next(
                (tmp_path / "home" / "work" / name / "validate").glob("*/reference.json")
            ).read_text()
        )
        requests = kind.requests(reference["items"])
        with inference(
            "grpc", f"127.0.0.1:{ports['grpc_port']}", name, version, kind.outputs
        ) as session:
            served = kind.extract([session(r) for r in requests])
        model = serving.load(str(version_dir))
        in_process = kind.extract(answer_in_batches(model, requests, 1))
        _same(kind_name, served, in_process)
    finally:
        triton_local.stop_server()
