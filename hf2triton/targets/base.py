"""The interface every deploy target implements. A rollout is, for every target:

1. `deploy`: the new version serves beside the one that serves now (the old one untouched);
2. the smoke test queries the new version on `endpoints`;
3. `promote`: it becomes what clients reach (and the MLflow alias `champion` moves);
4. `retire`: what served before is unloaded or removed;
and `rollback` undoes 1 (and 3) when anything before 4 fails, leaving the old version serving.
The release flow wraps 1-3 in one Prefect transaction whose rollback hook calls `rollback`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypedDict

from hf2triton.smoke import Endpoint

Check = Callable[[Endpoint], dict[str, float]]  # the kind's smoke test on one endpoint


class Deployment(TypedDict):
    target: str
    model_name: str
    version: str
    endpoints: list[Endpoint]  # where the smoke test queries the new version
    state: dict[str, Any]  # what rollback and retire need (JSON-able, no credentials)
    reused: bool


class DeployTarget:
    """One place a release can go. `spec` is its variant of the spec's `deploy` section; the
    release's name, work directory, MLflow model name and image section come with it."""

    name: ClassVar[str]

    def __init__(self, spec: Any, release: str, work: str = "", registry_model: str = "",
                 image: Any = None):
        self.spec = spec
        self.release = release
        self.work = work
        self.registry_model = registry_model or release
        self.image = image

    def deploy(self, repository: str, model_name: str, version: str, files: dict[str, str],
               image: dict[str, Any], check: Check) -> Deployment:
        """Put `version` beside what serves; raise (having cleaned up) if it cannot load."""
        raise NotImplementedError

    def promote(self, deployment: Deployment) -> Deployment:
        """Make the new version what clients reach (most targets: it already is, by number)."""
        return deployment

    def retire(self, deployment: Deployment) -> list[str]:
        """After promotion: stop serving what served before; returns what was retired."""
        return []

    def rollback(self, deployment: Deployment) -> None:
        """Back to what served before the deploy."""

    def summary(self, deployment: Deployment) -> dict[str, Any]:
        """The release summary's `endpoint` (and any target-specific) entries."""
        first = deployment["endpoints"][0]
        return {"endpoint": {
            "model": deployment["model_name"], "version": deployment["version"],
            "http": f"http://{first['http']}/v2/models/{deployment['model_name']}/versions/"
                    f"{deployment['version']}/infer",
            "grpc": first["grpc"]}}
