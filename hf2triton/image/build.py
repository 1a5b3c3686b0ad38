"""Building the release's serving image: the prerequisites (engine, registry, base image), the
build context (Dockerfile, wheelhouse, the Triton repository with every file's sha256 checked)
and the build itself, with no network in its RUN steps."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

from hf2triton.clients import docker as engine_client
from hf2triton.errors import ArtifactError, DockerUnavailableError, ImageBuildError
from hf2triton.image.dockerfile import DOCKERFILE, render_dockerfile, write_api_package
from hf2triton.image.target import ImageTarget
from hf2triton.image.variants import image_python, variant_for
from hf2triton.image.wheelhouse import ensure_wheelhouse
from hf2triton.util.runs import step_logger
from hf2triton.util.workspace import hash_files, hash_mismatch, home


class RepositoryFiles(TypedDict):
    """The Triton repository an image carries, as the repository step recorded it
    (hf2triton.release.repository.RepositoryResult holds these keys)."""

    repository: str  # directory holding <model_name>/
    model_name: str
    files: dict[str, str]  # relative path -> sha256


class ImageBuildResult(TypedDict):
    image_id: str
    tag: str
    base_image: str
    size_bytes: int
    labels: dict[str, str]
    seconds: float


def check_prerequisites(target: ImageTarget, logger: Any = None) -> str | None:
    """None when the image can be built and pushed here, else the reason it cannot.

    Checks the Docker engine, the registry and the base image (pulled when it is not present).
    """
    logger = logger or step_logger()
    try:
        client = engine_client.engine()
    except DockerUnavailableError as exc:
        return str(exc)
    reason = engine_client.registry_answers(target["registry"])
    if reason:
        return (
            f"{reason}; set image.registry (or HF2TRITON_REGISTRY), or start a local one "
            "with `bash infra/docker-env.sh up`"
        )
    import docker.errors

    try:
        client.api.inspect_image(target["base_image"])
    except docker.errors.ImageNotFound:
        logger.info("image: base %s is not on this engine; pulling it", target["base_image"])
        try:
            engine_client.pull(client, target["base_image"])
        except Exception as exc:  # noqa: BLE001 - whatever the reason, it is why we skip
            return (
                f"base image {target['base_image']} is not on this engine and cannot be "
                f"pulled ({engine_client.short(exc, 200)}); set image.base_image or "
                f"HF2TRITON_BASE_IMAGE to a Python {target.get('python', '3.11')} image the "
                "engine has (`bash infra/docker-env.sh up` imports one built with "
                "debootstrap)"
            )
    return None


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy a tree with modes the image's runtime user can read but not write (copies, not
    links: the modes must not change the release's own files)."""
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if "__pycache__" in rel.parts or path.name == "hf2triton-done.json":
            continue
        target = dst / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            target.chmod(0o755)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            target.chmod(0o644)


def _context(
    ctx: Path, repo: RepositoryFiles, version: str, wheelhouse: Path, target: ImageTarget
) -> None:
    """Build context: Dockerfile, wheelhouse/, the OpenAI-compatible API's package,
    model_repository/<model>/<version>/..."""
    (ctx / "Dockerfile").write_text(render_dockerfile(target, DOCKERFILE))
    write_api_package(ctx)
    (ctx / "wheelhouse").mkdir()
    for whl in wheelhouse.iterdir():
        if whl.suffix == ".whl" or whl.suffix == ".txt":
            try:
                os.link(whl, ctx / "wheelhouse" / whl.name)
            except OSError:
                shutil.copyfile(whl, ctx / "wheelhouse" / whl.name)
    model_name = repo["model_name"]
    dst = ctx / "model_repository" / model_name
    _place_model(Path(repo["repository"]) / model_name, dst, version)
    placed = {
        (
            f"{model_name}/1/" + k.removeprefix(f"{version}/")
            if k.startswith(f"{version}/")
            else f"{model_name}/{k}"
        ): v
        for k, v in hash_files(dst).items()
    }
    files = repo["files"]
    bad = hash_mismatch(placed, files)
    if bad:
        raise ArtifactError(
            f"files {bad[:5]} of the Triton repository do not match the sha256 recorded for this "
            "release: refusing to build an image from them; re-run the release to rebuild it"
        )


def _place_model(src: Path, dst: Path, version: str) -> None:
    """The model's directory `src` copied to `dst`, its version directory `1` as `version`."""
    dst.mkdir(parents=True)
    # The repository's version directory is `1`; the image serves it as the MLflow version, like
    # the local target, so clients address the same /v2/models/<name>/versions/<N>.
    for item in src.iterdir():
        if item.is_dir():
            _copy_tree(item, dst / (version if item.name == "1" else item.name))
        else:
            shutil.copyfile(item, dst / item.name)
    for p in [dst, *dst.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def build_serving_image(
    repo: RepositoryFiles,
    version: str,
    target: ImageTarget,
    lineage: dict[str, str],
    timeout_s: float = 1800,
) -> ImageBuildResult:
    """Build the serving image for one release and tag it `target["tag"]`; no network needed.

    `lineage` fills the image's labels: release, source_id, revision, content_hash, release_key,
    variant, model_name (MLflow) and version (MLflow).

    Example:
        >>> build_serving_image(repo, "3",
        ...     image_target(spec.image, "minilm-embedder", "3", key), lineage)  # doctest: +SKIP
    """
    logger = step_logger()
    started = time.monotonic()
    variant = variant_for(target.get("device"))
    target = ImageTarget(
        **{
            **target,
            "python": target.get("python") or image_python(target["base_image"], None, variant),
        }
    )
    wheelhouse = ensure_wheelhouse(logger, variant, target["python"])
    client = engine_client.engine()
    buildargs = _build_args(target, lineage, version)
    work = home() / "work" / lineage["release"]
    work.mkdir(parents=True, exist_ok=True)
    ctx = Path(tempfile.mkdtemp(dir=work, prefix=".image-context.", suffix=".tmp"))
    try:
        try:
            _context(ctx, repo, version, wheelhouse, target)
        except OSError as exc:
            raise ArtifactError(f"cannot assemble the build context in {ctx}: {exc}") from None
        logger.info("image: building %s on %s", target["tag"], target["base_image"])
        info = engine_client.build(client, str(ctx), target["tag"], buildargs, timeout_s, logger)
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    labels = info["Config"].get("Labels") or {}
    if labels.get("io.hf2triton.release-key") != lineage["release_key"]:
        raise ImageBuildError(f"the image tagged {target['tag']} lacks this release's labels")
    size = int(info["Size"])
    logger.info("image: built %s (%s), %.0f MB", target["tag"], info["Id"][:19], size / 1e6)
    return ImageBuildResult(
        image_id=info["Id"],
        tag=target["tag"],
        base_image=target["base_image"],
        size_bytes=size,
        labels=labels,
        seconds=round(time.monotonic() - started, 1),
    )


def _build_args(target: ImageTarget, lineage: dict[str, str], version: str) -> dict[str, str]:
    """The Dockerfile's build arguments: the base image, and the labels' values."""
    return {
        "BASE_IMAGE": target["base_image"],
        "RELEASE_NAME": lineage["release"],
        "SOURCE_ID": lineage["source_id"],
        "SOURCE_REVISION": lineage["revision"],
        "CONTENT_HASH": lineage["content_hash"],
        "RELEASE_KEY": lineage["release_key"],
        "VARIANT": lineage["variant"],
        "MLFLOW_MODEL_NAME": lineage["model_name"],
        "MLFLOW_MODEL_VERSION": version,
    }
