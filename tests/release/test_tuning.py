"""Triton configuration search: dynamic batching and execution settings measured against a real
served endpoint, and the chosen one written into the config.pbtxt the release registers and
serves. Tiny real BERT, real tritonserver, real MLflow (SQLite)."""

from __future__ import annotations

import json
import re

import pytest

from hf2triton.errors import SpecError
from hf2triton.flows.release import release_model
from hf2triton.release.tuning import choose
from hf2triton.spec import load_spec, parse_spec
from tests.conftest import free_port, tiny_spec

pytestmark = pytest.mark.e2e  # every test here starts a server or runs a release


def _cell(name: str, rps: float, p99: float, errors: int = 0, requests: int = 100) -> dict:
    return {
        "settings": {"name": name},
        "name": name,
        "score_rps": rps,
        "points": [
            {"clients": 4, "rps": rps, "p99_ms": p99, "errors": errors, "requests": requests}
        ],
    }


def test_choice_is_the_fastest_under_the_latency_cap_and_never_one_with_errors():
    cells = [
        _cell("slow", 100, 20),
        _cell("fast-but-late", 300, 90),
        _cell("broken", 900, 5, 3),
        _cell("measured-nothing", 950, float("nan"), requests=0),
        {
            "settings": {"name": "did-not-load"},
            "name": "did-not-load",
            "score_rps": 0.0,
            "points": [],
            "failed": "load failed",
        },
    ]
    best, cap_met = choose(cells, max_p99_ms=50)
    assert (best["name"], cap_met) == ("slow", True)
    best, cap_met = choose(cells, max_p99_ms=None)
    assert (best["name"], cap_met) == ("fast-but-late", True)
    best, cap_met = choose(cells, max_p99_ms=10)  # none keeps the cap: the fastest, and says so
    assert (best["name"], cap_met) == ("fast-but-late", False)


def test_search_is_refused_for_tasks_it_cannot_drive():
    with pytest.raises(SpecError, match="deploy.tuning.search cannot drive 'translation' releases"):
        parse_spec(
            {
                "name": "t",
                "task": "translation",
                "source": {"repo_id": "a/b", "revision": "main"},
                "validation": {"sentences": "x.txt"},
                "registry": {"model_name": "t"},
                "deploy": {"tuning": {"search": True}},
            }
        )


def test_release_ships_the_searched_config(tiny_bert, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from hf2triton.targets import triton_local
    from tests.served import triton_client

    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    # The deploy section's own configuration is a poor one: batches of 8 that wait up to 200 ms,
    # while only 4 clients send. The search must find and ship a better one.
    tuning = {
        "search": True,
        "preferred_batch_sizes": [[4, 8]],
        "max_queue_delay_us": [100],
        "execution": [[1, 0], [2, 1]],
        "clients": [4],
        "seconds": 1,
    }
    spec = load_spec(
        tiny_spec(
            tmp_path / "tiny.yaml",
            tiny_bert,
            ports,
            name="tiny-tuned",
            registry__model_name="tiny-tuned",
            deploy__tuning=tuning,
            deploy__max_queue_delay_us=200_000,
            deploy__preferred_batch_sizes=[8],
        )
    )
    try:
        summary = release_model(spec)
        version = summary["mlflow"]["version"]
        [found] = (tmp_path / "home" / "work" / "tiny-tuned" / "tune").glob("*/tuning.json")
        cells = json.loads(found.read_text())
        # The deploy section's own configuration and the grid's two: all measured, none failed.
        assert [c["settings"]["max_queue_delay_us"] for c in cells] == [200_000, 100, 100]
        assert [c["settings"]["instance_count"] for c in cells] == [1, 1, 2]
        assert all(p["requests"] > 0 and p["errors"] == 0 for c in cells for p in c["points"])
        best = max(cells, key=lambda c: c["score_rps"])["settings"]
        assert best["max_queue_delay_us"] == 100 and best["preferred_batch_sizes"] == [4, 8]

        # What Triton serves is the searched configuration, not the deploy section's.
        client = triton_client(f"127.0.0.1:{ports['http_port']}")
        try:
            served = client.get_model_config("tiny-tuned", version)
        finally:
            client.close()
        assert (
            int(served["dynamic_batching"]["max_queue_delay_microseconds"])
            == best["max_queue_delay_us"]
        )
        assert served["instance_group"][0]["count"] == best["instance_count"]
        assert served["dynamic_batching"]["preferred_batch_size"] == best["preferred_batch_sizes"]

        # The registered repository carries it too, and MLflow records the search.
        mlflow = MlflowClient(summary["mlflow"]["tracking_uri"])
        mv = mlflow.get_model_version("tiny-tuned", version)
        config = mlflow.download_artifacts(
            mv.run_id, "triton_repository/tiny-tuned/config.pbtxt", str(tmp_path / "dl")
        )
        text = open(config).read()
        assert re.search(rf"max_queue_delay_microseconds: {best['max_queue_delay_us']}\b", text)
        assert re.search(rf"instance_group \[\s*{{\s*count: {best['instance_count']}\b", text)
        run = mlflow.get_run(mv.run_id)
        assert run.data.metrics["tuning.rps_at_4"] > 0
        assert json.loads(run.data.params["tuning_chosen.instance_count"]) == best["instance_count"]
    finally:
        triton_local.stop_server()


def test_the_search_grid_tries_each_token_budget_with_the_batcher_settings():
    from hf2triton.release.tuning import grid
    from hf2triton.targets.base import DEFAULT_MAX_BATCH_TOKENS, TuningSpec
    from hf2triton.targets.local import LocalTritonDeploy

    deploy = LocalTritonDeploy(
        tuning=TuningSpec(
            search=True, max_batch_tokens=[0, 1024], max_queue_delay_us=[100], execution=[(1, 0)]
        )
    )
    cells = grid(deploy.tuning, deploy)
    assert cells[0]["max_batch_tokens"] == DEFAULT_MAX_BATCH_TOKENS  # the deploy section's own
    assert sorted(c["max_batch_tokens"] for c in cells[1:]) == [0, 1024]
    with pytest.raises(SpecError, match="max_batch_tokens needs at least one value"):
        parse_spec(
            {
                "name": "t",
                "source": {"path": "/m"},
                "validation": {"sentences": "x"},
                "registry": {"model_name": "t"},
                "deploy": {"tuning": {"search": True, "max_batch_tokens": []}},
            }
        )
