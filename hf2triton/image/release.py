"""The image step's rules, apart from its Prefect tasks (tasks/image.py): whether a release
builds its image, skips it (saying why) or fails without it, the labels the image carries,
and the summary the release prints."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypedDict

from hf2triton.errors import DockerUnavailableError
from hf2triton.image.build import ImageBuildResult, check_prerequisites
from hf2triton.image.push import PushResult
from hf2triton.image.spec import ImageSpec
from hf2triton.image.target import ImageTarget, image_target

LINEAGE_LABELS = ("source_id", "revision", "content_hash", "variant")


class ImageDeploy(Protocol):
    """What the image step reads of the spec's `deploy:` section (a target's section,
    hf2triton.targets)."""

    @property
    def target(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def runs_image(self) -> bool: ...


class ImageRelease(Protocol):
    """What the image step reads of a release's spec (hf2triton.spec.ReleaseSpec, a layer
    above this one)."""

    @property
    def name(self) -> str: ...

    @property
    def image(self) -> ImageSpec: ...

    @property
    def image_repository(self) -> str: ...

    @property
    def deploy(self) -> ImageDeploy: ...


class ImagePlan(TypedDict):
    target: ImageTarget | None  # None: skipped
    skipped: str | None  # why
    say: bool  # the skip is news worth a log line (not asked for by the spec)


def image_plan(spec: ImageRelease, version: str, release_key: str, logger: Any) -> ImagePlan:
    """Build (the target), or skip and why. With `image.build: auto` and a target that needs no
    image, a missing engine, registry or base image skips it (news, not a problem); with
    `image.build: true`, or a target that runs the image, that is a DockerUnavailableError."""
    if spec.image.build is False:
        return ImagePlan(target=None, skipped="image.build is false", say=False)
    target = image_target(
        spec.image, spec.image_repository, version, release_key, spec.deploy.device
    )
    why_not = check_prerequisites(target, logger)
    if not why_not:
        return ImagePlan(target=target, skipped=None, say=False)
    if spec.image.build is True or spec.deploy.runs_image:
        need = (
            f"deploy.target is {spec.deploy.target}"
            if spec.deploy.runs_image
            else "image.build is true"
        )
        raise DockerUnavailableError(f"the release needs its image ({need}) but {why_not}")
    return ImagePlan(target=None, skipped=why_not, say=True)


def image_labels(spec: ImageRelease, model_name: str, record: Mapping[str, Any]) -> dict[str, str]:
    """The image's labels: the release and its lineage."""
    lineage = record["lineage"]
    return {
        "release": spec.name,
        "model_name": model_name,
        "release_key": record["release_key"],
        **{k: lineage[k] for k in LINEAGE_LABELS},
    }


def image_summary(built: ImageBuildResult, pushed: PushResult) -> dict[str, Any]:
    """What the release summary says of its image."""
    return {
        "reference": pushed["reference"],
        "digest": pushed["digest"],
        "tag": pushed["tag"],
        "size_bytes": built["size_bytes"],
        "size_mb": round(built["size_bytes"] / 1e6, 1),
        "base_image": built["base_image"],
        "build_seconds": built["seconds"],
        "push_seconds": pushed["seconds"],
    }


def image_tags(built: ImageBuildResult, pushed: PushResult) -> dict[str, str]:
    """The MLflow version tags that name the image serving it."""
    return {
        "image.reference": pushed["reference"],
        "image.digest": pushed["digest"],
        "image.tag": pushed["tag"],
        "image.id": built["image_id"],
        "image.size_bytes": str(built["size_bytes"]),
        "image.base": built["base_image"],
    }
