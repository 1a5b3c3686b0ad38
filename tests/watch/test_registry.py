"""What the watch and the operator's commands keep in the MLflow registry (a SQLite store in a
private hf2triton home, tests/watch/conftest.py; no server): the champion and what it replaced,
when it was promoted or restored, the smoke reference a version was released with, and why a
version was rolled back."""

from __future__ import annotations

import json
import time

from hf2triton.clients.mlflow import Registry
from hf2triton.watch import registry as reg


def _model(name: str, versions: int, reference: dict | None = None) -> Registry:
    """`name` registered with `versions` versions, each from a run of its own (carrying
    reference.json when given)."""
    client = Registry()
    mlf = client.client
    mlf.create_registered_model(name)
    for _ in range(versions):
        run = mlf.create_run(experiment_id="0")
        if reference is not None:
            mlf.log_text(run.info.run_id, json.dumps(reference), "reference.json")
        mlf.set_terminated(run.info.run_id)
        mlf.create_model_version(name, source=run.info.artifact_uri, run_id=run.info.run_id)
    return client


def test_a_model_never_released_has_no_versions(registry_home):
    client = Registry()
    assert reg.versions(client, "never-released") == {
        "champion": None,
        "candidate": None,
        "previous": None,
        "promoted_at": None,
        "restored_at": None,
        "tags": {},
    }
    _model("released-no-alias", 1)
    assert reg.versions(client, "released-no-alias")["champion"] is None


def test_promotion_records_the_smoke_figures_what_it_replaced_and_when(registry_home):
    client = _model("promoted", 2)
    before = time.time()
    reg.promote(client, "promoted", "1", {"grpc_min_cosine": 0.99912345})
    first = reg.versions(client, "promoted")
    assert first["champion"] == "1" and first["previous"] is None
    assert first["tags"]["smoke.grpc_min_cosine"] == "0.999123"
    reg.promote(client, "promoted", "2", {"grpc_min_cosine": 0.998})
    client.set_alias("promoted", "candidate", "2")
    now = reg.versions(client, "promoted")
    assert (now["champion"], now["candidate"], now["previous"]) == ("2", "2", "1")
    assert before <= now["promoted_at"] <= time.time()
    assert now["restored_at"] is None
    # Promoting the champion again replaces nothing.
    assert reg.PREVIOUS not in reg.promotion_tags(client, "promoted", "2")


def test_a_rollback_moves_the_champion_back_and_says_why_on_the_bad_version(registry_home):
    client = _model("rolled", 2)
    reg.promote(client, "rolled", "1", {})
    reg.promote(client, "rolled", "2", {})
    client.client.update_model_version("rolled", "2", description="release of 2")
    reg.mark_rolled_back(client, "rolled", "2", "1", "watch: failure rate 9.00%")
    now = reg.versions(client, "rolled")
    assert now["champion"] == "1"
    assert now["restored_at"] is not None  # restored after its promotion: no further rollback
    assert now["tags"][reg.RESTORED_FROM] == "2"
    bad = client.version("rolled", "2")
    assert bad.tags[reg.ROLLED_BACK] == "watch: failure rate 9.00%"
    assert bad.tags[reg.ROLLED_BACK_TO] == "1"
    assert bad.description == "release of 2\n\nRolled back to version 1: watch: failure rate 9.00%"


def test_the_smoke_reference_a_version_was_released_with(registry_home):
    reference = {"items": ["a", "b"], "limits": {"min_cosine": 0.99}}
    client = _model("referenced", 1, reference)
    assert reg.smoke_reference(client, "referenced", "1") == reference
    cached = list((registry_home / "watch" / "references" / "referenced").glob("1-*.json"))
    assert len(cached) == 1  # read from MLflow once, then from the home
    _model("unreferenced", 1)
    assert reg.smoke_reference(Registry(), "unreferenced", "1") is None
