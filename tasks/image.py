"""Steps `build-image` and `push-image`: the release's serving image, built offline from the
Triton repository and a host wheelhouse, pushed to the registry, its digest recorded on the
MLflow version (hf2triton.image); whether it is built, skipped or required is
hf2triton.image.release's rule."""

from __future__ import annotations

from prefect import task

from hf2triton.clients.mlflow import Registry
from hf2triton.image import (
    ImageBuildResult,
    ImageTarget,
    PushResult,
    build_serving_image,
    image_tags,
    push_serving_image,
)
from hf2triton.image.release import image_labels, image_plan, image_summary
from hf2triton.release.record import Record
from hf2triton.release.repository import RepositoryResult
from hf2triton.spec import ReleaseSpec
from hf2triton.tasks.register import RegisterResult
from hf2triton.util.json_types import JSONObject
from hf2triton.util.runs import NO_PREFECT_CACHE, RETRY_TRANSIENT, step_logger


@task(
    name="build-image",
    task_run_name="build-image {target[tag]}",
    **RETRY_TRANSIENT,
    **NO_PREFECT_CACHE,
)
def build_image(
    repo: RepositoryResult,
    version: str,
    target: ImageTarget,
    labels: dict[str, str],
    timeout_s: float,
) -> ImageBuildResult:
    return build_serving_image(repo, version, target, labels, timeout_s)


@task(
    name="push-image",
    task_run_name="push-image {target[tag]}",
    **RETRY_TRANSIENT,
    **NO_PREFECT_CACHE,
)
def push_image(target: ImageTarget, spec: ReleaseSpec) -> PushResult:
    return push_serving_image(target, spec.image)


@task(name="record-image", **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
def record_image(reg: RegisterResult, built: ImageBuildResult, pushed: PushResult) -> None:
    Registry(reg["tracking_uri"]).tag_version(
        reg["model_name"], reg["version"], image_tags(built, pushed)
    )


def release_image(
    spec: ReleaseSpec, repo: RepositoryResult, reg: RegisterResult, record: Record
) -> JSONObject:
    """Build, push and record the image, or say plainly why it is skipped."""
    logger = step_logger()
    plan = image_plan(spec, reg["version"], record["release_key"], logger)
    if plan["target"] is None:
        if plan["say"]:
            logger.info("image: skipped (set image.build: true to require it): %s", plan["skipped"])
        return {"skipped": plan["skipped"]}
    target = plan["target"]
    built = build_image(
        repo,
        reg["version"],
        target,
        image_labels(spec, reg["model_name"], record),
        spec.image.build_timeout_s,
    )
    pushed = push_image(target, spec)
    record_image(reg, built, pushed)
    logger.info(
        "image: %s is %.0f MB; %s version %s carries its digest %s",
        pushed["tag"],
        built["size_bytes"] / 1e6,
        reg["model_name"],
        reg["version"],
        pushed["digest"],
    )
    return image_summary(built, pushed)
