"""Variant search: every quantization variant is gated and timed on this machine; the release
ships the fastest that passes, says why the others did not ship, and when none passes names the
one that came closest. Tiny real BERT, real MLflow (SQLite) and Triton."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hf2triton.errors import AccuracyGateError
from hf2triton.flows.release import release_model
from hf2triton.spec import load_spec
from tests.conftest import free_port, tiny_spec

pytestmark = pytest.mark.e2e  # every test here starts a server or runs a release

PER_TENSOR = "dynamic-int8/qint8/per-tensor"
PER_CHANNEL = "dynamic-int8/qint8/per-channel"


@pytest.fixture()
def release_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    from hf2triton.targets import triton_local

    triton_local.stop_server()


def _figures(tiny_bert, tmp_path, ports) -> dict[str, float]:
    """min cosine of every variant, from a search with a gate every variant passes (each
    judged: validation.judge_all)."""
    spec = load_spec(
        tiny_spec(
            tmp_path / "probe.yaml",
            tiny_bert,
            ports,
            name="tiny-probe",
            registry__model_name="tiny-probe",
            quantization__search=True,
            validation__judge_all=True,
            embedding__thresholds={"min_cosine": 0.5, "mean_cosine": 0.5, "spearman": 0.5},
        )
    )
    summary = release_model(spec)
    report = json.loads(open(summary_report(summary)).read())
    return {c["name"]: c["metrics"]["min_cosine"] for c in report["candidates"]}


def summary_report(summary: dict) -> str:
    from mlflow import MlflowClient

    from hf2triton.clients.mlflow import tracking_uri

    client = MlflowClient(tracking_uri(), registry_uri=tracking_uri())
    return client.download_artifacts(summary["mlflow"]["run_id"], "validation_report.json")


def test_search_ships_the_fastest_variant_that_passes_and_says_why(
    tiny_bert, tmp_path, release_env
):
    figures = _figures(tiny_bert, tmp_path, release_env)
    assert {
        PER_TENSOR,
        PER_CHANNEL,
        "fp32",
        "fp32/ort-all",
        "fp32/fused",
        "int8-blockwise/b32/acc4",
        "int8-blockwise/b128/acc0/fused",
    } <= set(figures)
    worse, better = sorted((PER_TENSOR, PER_CHANNEL), key=figures.get)
    assert figures[worse] < figures[better], figures
    # Between the two, unrounded: on the tiny model they differ in the 7th digit.
    threshold = (figures[worse] + figures[better]) / 2
    assert figures[worse] < threshold < figures[better], figures
    spec = load_spec(
        tiny_spec(
            tmp_path / "search.yaml",
            tiny_bert,
            release_env,
            quantization__search=True,
            quantization__per_channel=worse == PER_CHANNEL,
            # ONNX Runtime's grid alone: the pruned search times one runtime's in full
            # (tests/release/test_search.py), and this one is about the grid's figures.
            runtime__candidates=[{"name": "onnxruntime", "precision": "fp32"}],
            embedding__thresholds={"min_cosine": threshold, "mean_cosine": 0.5, "spearman": 0.5},
        )
    )
    summary = release_model(spec)
    assert summary["variant"] != worse
    report = json.loads(open(summary_report(summary)).read())
    by_name = {c["name"]: c for c in report["candidates"]}
    shipped = by_name[summary["variant"]]
    assert not shipped["misses"] and shipped["metrics"]["min_cosine"] >= threshold
    # Timed first, judged fastest first: every faster candidate was judged and missed the gate
    # (and says by how much); the slower ones were left unjudged, and say why.
    faster = [
        c for c in report["candidates"] if c["throughput"]["speed"] > shipped["throughput"]["speed"]
    ]
    assert all(c.get("judged", True) and c["misses"] for c in faster)
    slower = [
        c for c in report["candidates"] if c["throughput"]["speed"] < shipped["throughput"]["speed"]
    ]
    assert slower and all(
        not c.get("judged", True) and "slower than" in c["status"] for c in slower
    )
    if by_name[worse].get("judged", True):
        assert "min_cosine" in by_name[worse]["misses"]


def test_when_no_variant_passes_the_closest_is_named(tiny_bert, tmp_path, release_env, monkeypatch):
    """Limits no candidate can meet: every one of 1.0, against a PyTorch reference nudged off
    the model's own embeddings (fp32 can agree with PyTorch to the last bit, and would ship on
    a limit of 1.0). The gate refuses them all and names the closest."""
    from hf2triton.kinds.embedding import EmbeddingKind

    real = EmbeddingKind.reference

    def nudged(self, model_dir, cfg, data):
        found = np.asarray(real(self, model_dir, cfg, data), np.float32)
        return found + 1e-3 * np.random.default_rng(0).standard_normal(found.shape, np.float32)

    monkeypatch.setattr(EmbeddingKind, "reference", nudged)
    spec = load_spec(
        tiny_spec(
            tmp_path / "strict.yaml",
            tiny_bert,
            release_env,
            quantization__search=True,
            embedding__thresholds={"min_cosine": 1.0, "mean_cosine": 1.0, "spearman": 1.0},
        )
    )
    with pytest.raises(AccuracyGateError, match=r"closest: \S+") as info:
        release_model(spec)
    assert PER_TENSOR in str(info.value) and "fp32/ort-basic" in str(info.value)


def test_candidates_that_raise_are_refused_and_the_release_goes_on(
    tiny_bert, tmp_path, release_env, monkeypatch
):
    """Two planted variants of the OpenVINO plug-in: one whose build raises, one whose graph
    cannot be opened (not a model). Both are refused with their error in the gate's report and
    log; the release ships a candidate that passes."""
    from hf2triton.runtimes import openvino
    from hf2triton.runtimes.base import OPENVINO_IR, Recipe, Variant

    def broken_build():
        raise ValueError("planted: this quantizer does not know the graph")

    def unreadable():
        bad = tmp_path / "planted" / "model.xml"
        bad.parent.mkdir(exist_ok=True)
        bad.write_text("<not a model/>")
        bad.with_suffix(".bin").write_bytes(b"\0" * 16)
        return Variant(
            onnx_path=str(bad),
            method="planted-unreadable",
            graph=OPENVINO_IR,
            fallbacks={},
            fp32_bytes=0,
            size_bytes=16,
            sha256="",
            seconds=0.0,
            reused=False,
        )

    real = openvino.OpenVinoCpu.recipes
    monkeypatch.setattr(
        openvino.OpenVinoCpu,
        "recipes",
        classmethod(
            lambda cls, ctx: [
                Recipe("planted-raises", OPENVINO_IR, broken_build),
                Recipe("planted-unreadable", OPENVINO_IR, unreadable),
                *real.__func__(cls, ctx),
            ]
        ),
    )
    spec = load_spec(
        tiny_spec(
            tmp_path / "planted.yaml",
            tiny_bert,
            release_env,
            runtime__candidates=[{"name": "openvino", "precision": "fp32"}],
        )
    )
    summary = release_model(spec)
    assert summary["variant"] in ("openvino-int8 on openvino fp32", "fp32 on openvino fp32")
    report = json.loads(open(summary_report(summary)).read())
    by_name = {c["name"]: c for c in report["candidates"]}
    assert (
        "planted: this quantizer does not know the graph"
        in by_name["planted-raises on openvino fp32"]["error"]
    )
    assert by_name["planted-unreadable on openvino fp32"]["error"]  # OpenVINO's read error
    assert all(not by_name[n]["metrics"] for n in by_name if n.startswith("planted"))
    shipped = by_name[summary["variant"]]
    assert not shipped["misses"] and "error" not in shipped
