"""Steps `build-image` and `push-image`: the release's serving image, built offline from the
Triton repository and a host wheelhouse, pushed to the registry, its digest recorded on the
MLflow version (hf2triton.image). With `image.build: auto` and a target that needs no image, a
missing engine, registry or base image skips it and says why; otherwise that is an error."""

from __future__ import annotations

from typing import Any

from prefect import task

from hf2triton.clients.mlflow import Registry
from hf2triton.errors import DockerUnavailableError
from hf2triton.image import (
    ImageBuildResult,
    ImageTarget,
    PushResult,
    build_serving_image,
    check_prerequisites,
    image_tags,
    image_target,
    push_serving_image,
)
from hf2triton.record import Record
from hf2triton.repository import RepositoryResult
from hf2triton.runs import NO_PREFECT_CACHE, RETRY_TRANSIENT, step_logger
from hf2triton.spec import ReleaseSpec



@task(name="build-image", task_run_name="build-image {target[tag]}", **RETRY_TRANSIENT,
      **NO_PREFECT_CACHE)
def build_image(repo: RepositoryResult, version: str, target: ImageTarget,
                labels: dict[str, str], timeout_s: float) -> ImageBuildResult:
    return build_serving_image(repo["repository"], repo["model_name"], version, repo["files"],
                               target, labels, timeout_s)


@task(name="push-image", task_run_name="push-image {target[tag]}", **RETRY_TRANSIENT,
      **NO_PREFECT_CACHE)
def push_image(target: ImageTarget, spec: ReleaseSpec) -> PushResult:
    return push_serving_image(target, spec.image)


@task(name="record-image", **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
def record_image(reg: dict[str, Any], built: ImageBuildResult, pushed: PushResult) -> None:
    Registry(reg["tracking_uri"]).tag_version(reg["model_name"], reg["version"],
                                              image_tags(built, pushed))


def release_image(spec: ReleaseSpec, repo: RepositoryResult, reg: dict[str, Any],
                  record: Record) -> dict[str, Any]:
    """Build, push and record the image, or say plainly why it is skipped."""
    logger = step_logger()
    if spec.image.build is False:
        return {"skipped": "image.build is false"}
    target = image_target(spec.image, spec.image_repository, reg["version"],
                          record["release_key"], spec.deploy.device)
    why_not = check_prerequisites(target, logger)
    if why_not:
        if spec.image.build is True or spec.deploy.runs_image:
            need = f"deploy.target is {spec.deploy.target}" \
                if spec.deploy.runs_image else "image.build is true"
            raise DockerUnavailableError(f"the release needs its image ({need}) but {why_not}")
        # The default (image.build auto, target local-triton) needs no image: this is news, not
        # a problem; `image.build: true` turns it into an error.
        logger.info("image: skipped (set image.build: true to require it): %s", why_not)
        return {"skipped": why_not}
    lineage = record["lineage"]
    labels = {"release": spec.name, "model_name": reg["model_name"],
              "release_key": record["release_key"],
              **{k: lineage[k] for k in ("source_id", "revision", "content_hash", "variant")}}
    built = build_image(repo, reg["version"], target, labels, spec.image.build_timeout_s)
    pushed = push_image(target, spec)
    record_image(reg, built, pushed)
    logger.info("image: %s is %.0f MB; %s version %s carries its digest %s", pushed["tag"],
                built["size_bytes"] / 1e6, reg["model_name"], reg["version"], pushed["digest"])
    return {"reference": pushed["reference"], "digest": pushed["digest"], "tag": pushed["tag"],
            "size_bytes": built["size_bytes"], "size_mb": round(built["size_bytes"] / 1e6, 1),
            "base_image": built["base_image"], "build_seconds": built["seconds"],
            "push_seconds": pushed["seconds"]}
