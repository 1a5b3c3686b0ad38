"""What the watch shows and says: the table a user reads in Prefect's UI (one row per endpoint,
its verdict), the artifacts published under one key per release, and the breach event whose
resource the rollback automation matches."""

from __future__ import annotations

import asyncio

import pytest
from prefect import flow

from hf2triton.watch.observe import BREACH_EVENT, Look
from hf2triton.watch.publish import COLUMNS, emit_breach, publish, table


def _look(breaches: list[str], in_window: bool = True) -> Look:
    row = {
        "endpoint": "local",
        "model": "tiny",
        "version": "2",
        "requests": 120,
        "failed": 6,
        "failure_rate": 0.05,
        "request_rate": 12.0,
        "p50_ms": 3.0,
        "p99_ms": 9.5,
        "queue_ms": 0.2,
        "compute_ms": 2.0,
        "loaded": True,
        "grpc_min_cosine": 0.9991,
    }
    return Look(
        release="Tiny Embedder",
        model="tiny-embedder",
        champion="2",
        candidate=None,
        previous="1",
        at=1_700_000_000.0,
        in_window=in_window,
        streak=1 if breaches else 0,
        confirmed=bool(breaches),
        rows=[row, {**row, "endpoint": "replica-1", "failed": 0, "failure_rate": 0.0}],
        breaches=breaches,
    )


def test_table_has_the_figures_in_order_then_the_probes_and_a_verdict_per_endpoint():
    rows = table(_look(["local version 2: failure rate 5.00% over the budget 1.00%"]))
    assert [list(r)[: len(COLUMNS)] for r in rows] == [list(COLUMNS)] * 2
    assert rows[0]["grpc_min_cosine"] == 0.9991
    assert not {"model", "failed", "loaded"} & set(rows[0])  # said by other columns
    assert [r["verdict"] for r in rows] == ["breach", "within budget"]
    assert all(r["verdict"] == "within budget" for r in table(_look([])))


def _artifact(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
            )

    return asyncio.run(read())


def _in_a_flow(fn, *args):
    """`fn(*args)` inside a flow run, as the watch's step runs it."""

    @flow(validate_parameters=False)
    def run():
        return fn(*args)

    return run()


def test_publish_writes_the_table_and_the_mlflow_link_under_the_releases_keys():
    look = _look(["local version 2: failure rate 5.00% over the budget 1.00%"])
    # A release name of its own: the session's Prefect server also holds the artifacts of the
    # e2e watch tests' "tiny-embedder" releases, under that release's keys.
    look["release"] = "Publish Probe"
    key = _in_a_flow(publish, look, "http://admin:secret@mlflow.example:5000")
    assert key == "publish-probe-watch"
    table_artifact = _artifact(key)[-1]
    assert table_artifact.type == "table"
    assert "champion version 2 (in the rollback window)" in table_artifact.description
    assert "failure rate 5.00%" in table_artifact.description
    link = _artifact("publish-probe-watch-mlflow")[-1]
    assert "mlflow.example:5000/#/models/tiny-embedder/versions/2" in str(link.data)
    assert "secret" not in str(link.data)


def test_a_sqlite_registry_gets_no_link():
    look = _look([], in_window=False)
    look["release"] = "no-link-release"
    key = _in_a_flow(publish, look, "sqlite:///tmp/mlflow.db")
    assert "after the rollback window" in _artifact(key)[-1].description
    assert "within budget" in _artifact(key)[-1].description
    assert _artifact("no-link-release-watch-mlflow") == []


@pytest.mark.parametrize("in_window", [True, False])
def test_the_breach_event_carries_what_the_automation_matches(in_window):
    breaches = ["local version 2: p99 900.0 ms over the budget 100.0 ms", "replica-1 ..."]
    event = emit_breach(_look(breaches, in_window))
    assert event is not None and event.event == BREACH_EVENT
    resource = dict(event.resource)
    assert resource["prefect.resource.id"] == "hf2triton.release.Tiny Embedder"
    assert resource["hf2triton.in-window"] == ("true" if in_window else "false")
    assert resource["hf2triton.version"] == "2"
    assert event.payload["reason"] == "; ".join(breaches)
    assert event.payload["rows"][0]["verdict"] == "breach"
