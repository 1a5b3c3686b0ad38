"""Deploy targets as plug-ins: one module each, registered in `TARGETS` (hf2triton.targets.base)
by the spec's `deploy.target`. A target's module holds its `deploy:` section (`Spec`: only its
own keys, and whether it runs the release's image) and the rollout. A new target is a new module
that registers itself where it is defined (`@TARGETS.register`), and its name in the import line
here.

Example:
    >>> target = target_for(spec, work)   # hf2triton.spec: chosen once, from deploy.target
    >>> target.name
    'local-triton'
"""

from __future__ import annotations

# The plug-in modules, imported so that each registers its target in TARGETS.
from hf2triton.targets import docker, kserve, local, replicas  # noqa: F401
from hf2triton.targets.base import (
    TARGETS,
    Check,
    Deployment,
    DeploySection,
    DeployTarget,
    WatchPoint,
)

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
