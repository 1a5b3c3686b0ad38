"""The plug-ins a release spec chooses, once, at the start of a release: its model kind (from
`task`) and its deploy target (from `deploy.target`), each given only the settings it owns."""

from __future__ import annotations

from hf2triton.kinds import ModelKind, kind_class
from hf2triton.kinds.config import KindConfig
from hf2triton.spec.release import ReleaseSpec
from hf2triton.targets import DeployTarget, target_class


def kind_for(spec: ReleaseSpec) -> ModelKind[KindConfig]:
    """The model kind of a release: its own section and the validation data's settings."""
    kind: ModelKind[KindConfig] = kind_class(spec.task)(spec.task_section, spec.validation)
    return kind


def target_for(spec: ReleaseSpec, work: str) -> DeployTarget:
    """The deploy target of a release, from its spec's deploy section."""
    target: DeployTarget = target_class(spec.deploy.target)(
        spec.deploy, spec.name, work, spec.registry.model_name, spec.image
    )
    return target
