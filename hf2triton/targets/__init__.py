"""Deploy targets as plug-ins: one module each, registered in `TARGETS` by the spec's
`deploy.target`. A target's module holds its `deploy:` section (`Spec`: only its own keys, and
whether it runs the release's image) and the rollout. A new target is a new module and one line
here.

Example:
    >>> target = target_for(spec, work)   # hf2triton.spec: chosen once, from deploy.target
    >>> target.name
    'local-triton'
"""

from __future__ import annotations

from hf2triton.targets.base import Check, Deployment, DeploySection, DeployTarget, WatchPoint
from hf2triton.util import plugins

# spec `deploy.target:` -> the target's class; each target's module registers it.
TARGETS = plugins.Registry(lambda cls: cls.name, default="local-triton")
from hf2triton.targets import docker, kserve, local, replicas  # noqa: E402,F401,I001

target_class = TARGETS.load
# The `deploy:` section: one variant per registered target, each with only its own keys.
DeploySpec = TARGETS.union("target", section=lambda cls: cls.Spec)


def default_deploy() -> DeploySection:
    return target_class(TARGETS.default).Spec()


__all__ = [
    "TARGETS",
    "Check",
    "DeploySection",
    "DeploySpec",
    "DeployTarget",
    "Deployment",
    "WatchPoint",
    "default_deploy",
    "target_class",
]
