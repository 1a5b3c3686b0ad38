"""Prefect deployments from release specs: `prefect.yaml` is rendered from `releases/*.yaml`, one
deployment per spec whose parameters are the spec itself, so the two never drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hf2triton.spec import ReleaseSpec, load_spec
from hf2triton.workspace import PROJECT_ROOT

WORK_POOL = "hf2triton-process"
HEADER = """\
# Rendered from releases/*.yaml by `hf2triton deployments render`; edit the specs, not this file.
# Deploy from the project root:  prefect --no-prompt deploy --all
# (needs the work pool:          prefect work-pool create hf2triton-process --type process)
"""


def _portable(spec: ReleaseSpec, root: Path) -> dict[str, Any]:
    """The spec as deployment parameters, with paths relative to the project root (the worker's
    working directory) so the file holds no machine-specific path."""
    data = spec.model_dump(mode="json", exclude={"schedule"}, exclude_none=True)
    deploy = data["deploy"]
    data["deploy"] = {"target": deploy.pop("target"), **deploy}  # what the section is, first
    for section, key in (("validation", "sentences"), ("source", "path")):
        value = data.get(section, {}).get(key)
        if value and Path(value).is_absolute() and Path(value).is_relative_to(root):
            data[section][key] = Path(value).relative_to(root).as_posix()
    return data


def deployment(spec: ReleaseSpec, name: str, root: Path = PROJECT_ROOT) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "entrypoint": "flows/release.py:release_model",
        "description": f"Release {spec.source.lineage_id} as {spec.registry.model_name} "
                       f"({spec.task.value}) to {spec.deploy.target}.",
        "tags": ["hf2triton", spec.task.value, f"release:{spec.name}"],
        "parameters": {"spec": _portable(spec, root)},
        "work_pool": {"name": WORK_POOL, "work_queue_name": "default"},
        # One run per release name at a time; a second waits rather than racing the first.
        "concurrency_limit": {"limit": 1, "collision_strategy": "ENQUEUE"},
        "schedules": [],
    }
    if spec.schedule is not None:
        entry["schedules"] = [{
            "cron": spec.schedule.cron, "timezone": spec.schedule.timezone,
            "active": spec.schedule.active,
        }]
    return entry


def render(spec_paths: list[Path], root: Path = PROJECT_ROOT) -> str:
    """The prefect.yaml text for the given spec files."""
    config = {
        "name": "hf2triton",
        "prefect-version": "3.8.8",
        "build": None,
        "push": None,
        "pull": [{"prefect.deployments.steps.set_working_directory": {
            "directory": "{{ $PWD }}"}}],
        # Named after the spec file: two specs may release under the same name (e.g. to two
        # targets), while deployment names must be unique.
        "deployments": [deployment(load_spec(p), p.stem, root) for p in sorted(spec_paths)],
    }
    return HEADER + yaml.safe_dump(config, sort_keys=False, allow_unicode=True, width=100)


def release_specs(root: Path = PROJECT_ROOT) -> list[Path]:
    return sorted((root / "releases").glob("*.yaml"))
