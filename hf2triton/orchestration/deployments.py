"""Prefect deployments from release specs: `prefect.yaml` is rendered from `releases/*.yaml`, one
deployment per spec whose parameters are the spec itself, so the two never drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hf2triton.kinds import kind_class, kind_classes
from hf2triton.spec import ReleaseSpec, TrainingSpec, load_spec
from hf2triton.util.workspace import PROJECT_ROOT
from hf2triton.watch.observe import BREACH_EVENT

WORK_POOL = "hf2triton-process"
# Every deployment's first tag; the dead-run automation (hf2triton.orchestration.prefect_api) acts
# on its runs.
RUN_TAG = "hf2triton"
# What every run does before its flow: its working directory, then the automation that marks a run
# Crashed when its process died (hf2triton.orchestration.prefect_api.ensure_dead_run_automation).
PULL_STEPS = [
    {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $PWD }}"}},
    {"hf2triton.orchestration.prefect_api.ensure_dead_run_automation": {}},
]
HEADER = """\
# Rendered from releases/*.yaml by `hf2triton deployments render`; edit the specs, not this file.
# Deploy from the project root:  prefect --no-prompt deploy --all
# (needs the work pool:          prefect work-pool create hf2triton-process --type process)
"""


def _relative(data: object, root: Path) -> object:
    """Every absolute path under the project root, made relative to it (the worker's working
    directory), so the file holds no machine-specific path."""
    if isinstance(data, dict):
        return {k: _relative(v, root) for k, v in data.items()}
    if isinstance(data, list):
        return [_relative(v, root) for v in data]
    if isinstance(data, str) and data.startswith("/") and Path(data).is_relative_to(root):
        return Path(data).relative_to(root).as_posix()
    return data


def _portable(spec: ReleaseSpec, root: Path) -> dict[str, Any]:
    """The spec as deployment parameters, paths relative to the project root."""
    # Only the task's own section: another task's (even its defaults) is refused on the way back.
    others = {k.section for k in kind_classes()} - {kind_class(spec.task).section}
    data = spec.model_dump(mode="json", exclude={"schedule", *others}, exclude_none=True)
    deploy = data["deploy"]
    data["deploy"] = {"target": deploy.pop("target"), **deploy}  # what the section is, first
    portable = _relative(data, root)
    assert isinstance(portable, dict)  # a mapping stays one
    return portable


def release_tag(name: str) -> str:
    """The tag every deployment of release `name` carries (the watch finds its own by it)."""
    return f"release:{name}"


def _schedules(schedule: Any) -> list[dict[str, Any]]:
    return (
        []
        if schedule is None
        else [{"cron": schedule.cron, "timezone": schedule.timezone, "active": schedule.active}]
    )


def deployment(spec: ReleaseSpec, name: str, root: Path = PROJECT_ROOT) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "entrypoint": "flows/release.py:release_model",
        "description": f"Release {spec.source.lineage_id} as {spec.registry.model_name} "
        f"({spec.task}) to {spec.deploy.target}.",
        "tags": [RUN_TAG, spec.task, release_tag(spec.name)],
        "parameters": {"spec": _portable(spec, root)},
        "work_pool": {"name": WORK_POOL, "work_queue_name": "default"},
        # One run per release name at a time; a second waits rather than racing the first.
        "concurrency_limit": {"limit": 1, "collision_strategy": "ENQUEUE"},
        "schedules": _schedules(spec.schedule),
    }
    trigger = spec.source.trigger(name, entry["parameters"]["spec"])  # e.g. a followed alias
    if trigger:
        entry["triggers"] = [trigger]
    return entry


def watch_deployments(
    spec: ReleaseSpec, name: str, root: Path = PROJECT_ROOT
) -> list[dict[str, Any]]:
    """The watch of a release (hf2triton.watch) as three deployments: `watch-release` on the
    watch's cron (a breach emits `hf2triton.watch.breach`), `rollback-release` started by the
    automation that answers a breach inside the rollback window (and by hand), and
    `release-status`."""
    if not spec.watch.enabled:
        return []
    # One spec object for all three: YAML writes it once and refers to it (an anchor).
    params = {"spec": _portable(spec, root)}
    common = {
        "tags": [RUN_TAG, "watch", release_tag(spec.name)],
        "work_pool": {"name": WORK_POOL, "work_queue_name": "default"},
    }
    breach = {
        "type": "event",
        "enabled": True,
        "name": f"{name}-rollback-on-breach",
        "match": {
            "prefect.resource.id": f"hf2triton.release.{spec.name}",
            "hf2triton.in-window": "true",
        },
        "expect": [BREACH_EVENT],
        # Prefect merges trigger parameters into the deployment's at the top level only.
        "parameters": {
            **params,
            "reason": "watch: {{ event.payload.reason }}",
            "only_if_champion": "{{ event.resource['hf2triton.version'] }}",
        },
    }
    return [
        {
            "name": name,
            "entrypoint": "flows/watch.py:watch_release",
            "description": f"Watch what {spec.name} serves: Triton metrics and a smoke probe "
            "against the spec's watch budgets (docs/watch.md).",
            **common,
            "parameters": {**params, "duration_s": 0, "act": "event"},
            "concurrency_limit": {"limit": 1, "collision_strategy": "CANCEL_NEW"},
            "schedules": [{"cron": spec.watch.cron, "timezone": "UTC", "active": True}],
        },
        {
            "name": name,
            "entrypoint": "flows/watch.py:rollback_release",
            "description": f"Serve {spec.name}'s previous champion again; started by a breach of "
            "its watch budgets inside the rollback window.",
            **common,
            "parameters": {**params, "reason": "rolled back by hand"},
            "concurrency_limit": {"limit": 1, "collision_strategy": "ENQUEUE"},
            "triggers": [breach],
        },
        {
            "name": name,
            "entrypoint": "flows/watch.py:release_status",
            "description": f"{spec.name}: champion, candidate, what serves, the watch's figures.",
            **common,
            "parameters": params,
        },
    ]


def training_deployment(spec: TrainingSpec, name: str, root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """The retraining flow of a training spec (releases/training/), on its schedule."""
    return {
        "name": name,
        "entrypoint": "flows/train.py:train_classifier",
        "description": f"Fine-tune {spec.base.lineage_id} on {Path(spec.data).name} and register "
        f"it as {spec.registry.model_name} (alias {spec.alias}).",
        "tags": [RUN_TAG, "training", f"model:{spec.registry.model_name}"],
        "parameters": {
            "spec": _relative(
                spec.model_dump(mode="json", exclude={"schedule"}, exclude_none=True), root
            )
        },
        "work_pool": {"name": WORK_POOL, "work_queue_name": "default"},
        "concurrency_limit": {"limit": 1, "collision_strategy": "ENQUEUE"},
        "schedules": _schedules(spec.schedule),
    }


def render(
    spec_paths: list[Path], root: Path = PROJECT_ROOT, training_paths: list[Path] | None = None
) -> str:
    """The prefect.yaml text for the given release (and training) spec files."""
    config = {
        "name": "hf2triton",
        "prefect-version": "3.8.8",
        "build": None,
        "push": None,
        "pull": PULL_STEPS,
        # Named after the spec file: two specs may release under the same name (e.g. to two
        # targets), while deployment names must be unique.
        "deployments": [deployment(load_spec(p), p.stem, root) for p in sorted(spec_paths)]
        + [d for p in sorted(spec_paths) for d in watch_deployments(load_spec(p), p.stem, root)]
        + [
            training_deployment(load_spec(p, TrainingSpec), p.stem, root)
            for p in sorted(training_paths or [])
        ],
    }
    return HEADER + yaml.safe_dump(config, sort_keys=False, allow_unicode=True, width=100)


def release_specs(root: Path = PROJECT_ROOT) -> list[Path]:
    return sorted((root / "releases").glob("*.yaml"))


def training_specs(root: Path = PROJECT_ROOT) -> list[Path]:
    return sorted((root / "releases" / "training").glob("*.yaml"))
