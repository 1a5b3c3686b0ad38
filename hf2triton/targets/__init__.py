"""Deploy targets as plug-ins: one module each, registered in `TARGETS` by the spec's
`deploy.target`. A target's module holds its `deploy:` section (`Spec`: only its own keys, and
whether it runs the release's image) and the rollout. A new target is a new module and one line
here.

Example:
    >>> target = target_for(spec, work)      # chosen once, from spec.deploy.target
    >>> target.name
    'local-triton'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Discriminator, Tag

from hf2triton import plugins
from hf2triton.targets.base import Check, Deployment, DeploySection, DeployTarget

if TYPE_CHECKING:
    from hf2triton.spec import ReleaseSpec

# spec `deploy.target:` -> "module:class" of the target.
TARGETS: dict[str, str] = {
    "local-triton": "hf2triton.targets.local:LocalTriton",
    "triton-replicas": "hf2triton.targets.replicas:TritonReplicas",
    "docker": "hf2triton.targets.docker:DockerContainers",
    "kserve": "hf2triton.targets.kserve:KServe",
}
DEFAULT = "local-triton"


def target_class(name: str) -> type[DeployTarget]:
    return plugins.load(TARGETS, name)


def _target_of(value: Any) -> str | None:
    """A deploy section without `target` is the default target."""
    return value.get("target", DEFAULT) if isinstance(value, dict) else \
        getattr(value, "target", None)


# The `deploy:` section: one variant per registered target, each with only its own keys.
DeploySpec = Annotated[
    Union[tuple(Annotated[target_class(t).Spec, Tag(t)] for t in TARGETS)],  # noqa: UP007
    Discriminator(_target_of),
]


def default_deploy() -> DeploySection:
    return target_class(DEFAULT).Spec()


def target_for(spec: ReleaseSpec, work: str) -> DeployTarget:
    """The deploy target of a release, from its spec's deploy section."""
    target = target_class(spec.deploy.target)
    return target(spec.deploy, spec.name, work, spec.registry.model_name, spec.image)


__all__ = ["TARGETS", "Check", "DeploySpec", "Deployment", "DeploySection", "DeployTarget",
           "default_deploy", "target_class", "target_for"]
