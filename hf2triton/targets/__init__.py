"""Deploy targets as plug-ins: one module each, registered in `TARGETS` by the spec's
`deploy.target` (a discriminated union: each target's section carries only its own fields).

Example:
    >>> target = target_for(spec, work)      # chosen once, from spec.deploy.target
    >>> target.name
    'local-triton'
"""

from __future__ import annotations

from hf2triton import plugins
from hf2triton.spec import ReleaseSpec
from hf2triton.targets.base import Check, Deployment, DeployTarget

# spec `deploy.target:` -> "module:class" (imported when first used).
TARGETS: dict[str, str] = {
    "local-triton": "hf2triton.targets.local:LocalTriton",
    "triton-replicas": "hf2triton.targets.replicas:TritonReplicas",
    "docker": "hf2triton.targets.docker:DockerContainers",
    "kserve": "hf2triton.targets.kserve:KServe",
}


def target_for(spec: ReleaseSpec, work: str) -> DeployTarget:
    """The deploy target of a release, from its spec's deploy section."""
    target = plugins.load(TARGETS, spec.deploy.target)
    return target(spec.deploy, spec.name, work, spec.registry.model_name, spec.image)


__all__ = ["TARGETS", "Check", "Deployment", "DeployTarget", "target_for"]
