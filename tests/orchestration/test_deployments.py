"""prefect.yaml rendered from release specs: one release deployment per spec whose parameters are
the spec itself (paths relative to the project, so it holds nothing of this machine), the watch's
three deployments with the automation that rolls back on a breach, and the training flows.
(Deploying them on a real Prefect server is tests/orchestration/test_prefect.py's.)"""

from __future__ import annotations

import yaml

from hf2triton.orchestration.deployments import (
    HEADER,
    RUN_TAG,
    WORK_POOL,
    deployment,
    release_specs,
    render,
    training_specs,
    watch_deployments,
)
from hf2triton.spec import ReleaseSpec, TrainingSpec, load_spec, parse_spec
from hf2triton.watch.observe import BREACH_EVENT
from tests.conftest import ROOT, write_spec


def test_a_release_deployment_carries_its_spec_with_project_relative_paths(tmp_path):
    spec = load_spec(write_spec(tmp_path / "tiny.yaml", name="tiny"))
    entry = deployment(spec, "tiny-file", root=ROOT)
    assert entry["entrypoint"] == "flows/release.py:release_model"
    assert entry["tags"] == [RUN_TAG, "feature-extraction", "release:tiny"]
    assert entry["work_pool"]["name"] == WORK_POOL
    assert entry["concurrency_limit"] == {"limit": 1, "collision_strategy": "ENQUEUE"}
    params = entry["parameters"]["spec"]
    assert params["validation"]["sentences"] == "releases/data/embedding-validation.txt"
    assert list(params["deploy"])[0] == "target"
    assert "schedule" not in params and "translation" not in params  # another kind's section
    # What the worker gets back is the spec itself.
    back = parse_spec(params, ROOT)
    assert back.model_dump(exclude={"schedule"}) == spec.model_dump(exclude={"schedule"})
    assert entry["schedules"] == [{"cron": "0 3 * * 1", "timezone": "UTC", "active": True}]


def test_the_watch_is_three_deployments_and_a_rollback_on_a_breach_in_its_window(tmp_path):
    spec = load_spec(write_spec(tmp_path / "tiny.yaml", name="tiny", watch__cron="*/5 * * * *"))
    watch, rollback, status = watch_deployments(spec, "tiny-file", root=ROOT)
    assert [d["entrypoint"] for d in (watch, rollback, status)] == [
        "flows/watch.py:watch_release",
        "flows/watch.py:rollback_release",
        "flows/watch.py:release_status",
    ]
    assert watch["schedules"][0]["cron"] == "*/5 * * * *"
    assert watch["concurrency_limit"]["collision_strategy"] == "CANCEL_NEW"
    (trigger,) = rollback["triggers"]
    assert trigger["expect"] == [BREACH_EVENT]
    assert trigger["match"] == {
        "prefect.resource.id": "hf2triton.release.tiny",
        "hf2triton.in-window": "true",
    }
    assert trigger["parameters"]["only_if_champion"] == "{{ event.resource['hf2triton.version'] }}"
    off = load_spec(write_spec(tmp_path / "off.yaml", name="off", watch__enabled=False))
    assert watch_deployments(off, "off") == []


def test_render_writes_prefect_yaml_for_the_specs(tmp_path):
    first = write_spec(tmp_path / "b-spec.yaml", name="b-release")
    second = write_spec(tmp_path / "a-spec.yaml", name="a-release", watch__enabled=False)
    text = render([first, second], root=ROOT, training_paths=training_specs(ROOT))
    assert text.startswith(HEADER)
    config = yaml.safe_load(text)
    names = [(d["name"], d["entrypoint"].split(":")[1]) for d in config["deployments"]]
    assert names[:2] == [("a-spec", "release_model"), ("b-spec", "release_model")]
    assert ("b-spec", "watch_release") in names and ("a-spec", "watch_release") not in names
    assert str(ROOT) + "/" not in text  # everything in the project is relative
    trainings = [d for d in config["deployments"] if d["entrypoint"].startswith("flows/train")]
    assert len(trainings) == len(training_specs(ROOT)) >= 1
    for d in trainings:
        parse_spec(d["parameters"]["spec"], ROOT, model=TrainingSpec)


def test_the_projects_specs_are_found():
    assert ROOT / "releases" / "minilm-embedder.yaml" in release_specs(ROOT)
    assert all(isinstance(load_spec(p), ReleaseSpec) for p in release_specs(ROOT)[:3])
