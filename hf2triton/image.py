"""The release's serving image: where it goes (registry, repository, tag), the wheels it installs
offline (downloaded on the host once), its build context (Dockerfile, wheelhouse, the Triton
repository with every file's sha256 checked), and its build and push through the Docker engine
(hf2triton.clients.docker).

Tag: `<registry>/<repository>:<MLflow version>-<first 12 of the release key>`; what runs is the
pushed digest, `<registry>/<repository>@sha256:...`, the same one recorded in MLflow.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

from prefect.blocks.core import Block
from pydantic import SecretStr

from hf2triton.clients import docker as engine_client
from hf2triton.errors import (
    ArtifactError,
    DockerUnavailableError,
    ImageBuildError,
    RegistryAuthError,
    ServiceUnavailableError,
)
from hf2triton.runs import load_block, step_logger
from hf2triton.spec import ImageSpec
from hf2triton.workspace import PROJECT_ROOT, cached_step, digest, hash_files, home

DOCKERFILE = PROJECT_ROOT / "infra" / "Dockerfile"
SERVING_REQUIREMENTS = PROJECT_ROOT / "infra" / "serving-requirements.txt"
TRITON_PACKAGE = "nvidia-pytriton"
# The image is Debian bookworm (glibc 2.36), CPython 3.11, x86_64, whatever the host is: ask pip
# for wheels of that platform explicitly (it does not expand manylinux_2_36 to older tags itself).
PIP_PLATFORM = [
    "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
    "--abi", "cp311", "--abi", "abi3", "--abi", "none",
    *[a for m in range(36, 16, -1) for a in ("--platform", f"manylinux_2_{m}_x86_64")],
    "--platform", "manylinux2014_x86_64",
]
ENV_USERNAME, ENV_PASSWORD = "HF2TRITON_REGISTRY_USERNAME", "HF2TRITON_REGISTRY_PASSWORD"
# pip's own words for a download that failed on the network, not on the requirement.
PIP_NETWORK_FAILURES = ("Connection", "timed out", "Temporary failure", "HTTP error 5")


class RegistryCredentials(Block):
    """Credentials for the image registry, kept as a Prefect block; the password is a SecretStr.

    Example:
        >>> RegistryCredentials(username="ci", password="...").save("prod-registry")  # doctest: +SKIP
        and in the spec: `image: {credentials_block: prod-registry}`
    """

    _block_type_name = "hf2triton Registry Credentials"
    _block_type_slug = "hf2triton-registry-credentials"
    username: str
    password: SecretStr


class ImageTarget(TypedDict):
    registry: str
    repository: str  # registry/repository
    base_image: str
    tag: str  # registry/repository:version-hash


class ImageBuildResult(TypedDict):
    image_id: str
    tag: str
    base_image: str
    size_bytes: int
    labels: dict[str, str]
    seconds: float


class PushResult(TypedDict):
    tag: str
    digest: str  # sha256:...
    reference: str  # registry/repository@sha256:...
    seconds: float


def image_target(image: ImageSpec, repository: str, version: str, release_key: str) -> ImageTarget:
    """Where the image goes; $HF2TRITON_REGISTRY and $HF2TRITON_BASE_IMAGE override the spec."""
    registry = os.environ.get("HF2TRITON_REGISTRY") or image.registry
    base = os.environ.get("HF2TRITON_BASE_IMAGE") or image.base_image
    repo = f"{registry}/{repository}"
    return ImageTarget(registry=registry, repository=repo, base_image=base,
                       tag=f"{repo}:{version}-{release_key[:12]}")


# ---- the wheelhouse -------------------------------------------------------------------------


def _requirements() -> tuple[list[str], list[str]]:
    """(the Triton wheel, everything else) from infra/serving-requirements.txt."""
    lines = [ln.split("#")[0].strip() for ln in SERVING_REQUIREMENTS.read_text().splitlines()]
    reqs = [ln for ln in lines if ln]
    triton = [r for r in reqs if re.split(r"[=<>!~\[ ]", r)[0].lower() == TRITON_PACKAGE]
    if len(triton) != 1:
        raise ArtifactError(f"{SERVING_REQUIREMENTS} must pin {TRITON_PACKAGE} exactly once")
    return triton, [r for r in reqs if r not in triton]


def wheelhouse_root() -> Path:
    """$HF2TRITON_WHEELHOUSE, else .cache/wheelhouse in the project (ignored by git)."""
    return Path(os.environ.get("HF2TRITON_WHEELHOUSE") or PROJECT_ROOT / ".cache" / "wheelhouse")


def ensure_wheelhouse(logger: Any = None) -> Path:
    """Download the serving image's wheels once (reused while the requirements stay the same)."""
    logger = logger or step_logger()
    triton, runtime = _requirements()
    key = digest(["wheelhouse-v1", triton, runtime, PIP_PLATFORM])

    def build(out: Path) -> dict:
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(out),
               "--disable-pip-version-check", *PIP_PLATFORM]
        logger.info("image: downloading the serving wheels (%s) into %s",
                    ", ".join(triton + runtime), out.parent)
        for extra, reqs in ((["--no-deps"], triton), ([], runtime)):
            proc = subprocess.run([*pip, *extra, *reqs], capture_output=True, text=True,
                                  timeout=1800)
            if proc.returncode != 0:
                tail = " ".join(proc.stderr.strip().splitlines()[-3:])
                # pip reports no status code: its exit code is 1 for every failure.
                err = ServiceUnavailableError if any(s in tail for s in PIP_NETWORK_FAILURES) \
                    else ImageBuildError
                raise err(f"pip could not download the serving wheels {reqs}: {tail}")
        (out / "triton.txt").write_text("\n".join(triton) + "\n")
        (out / "runtime.txt").write_text("\n".join(runtime) + "\n")
        return {"wheels": sorted(p.name for p in out.glob("*.whl"))}

    done = cached_step(wheelhouse_root(), "wheels", key, build)
    if done.reused:
        logger.info("image: wheelhouse %s reused (%d wheels)", done.path,
                    len(done.result["wheels"]))
    return done.path


# ---- Docker engine, registry, base image ----------------------------------------------------


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
        return (f"{reason}; set image.registry (or HF2TRITON_REGISTRY), or start a local one "
                "with `bash infra/docker-env.sh up`")
    import docker.errors

    try:
        client.api.inspect_image(target["base_image"])
    except docker.errors.ImageNotFound:
        logger.info("image: base %s is not on this engine; pulling it", target["base_image"])
        try:
            engine_client.pull(client, target["base_image"])
        except Exception as exc:  # noqa: BLE001 - whatever the reason, it is why we skip
            return (f"base image {target['base_image']} is not on this engine and cannot be "
                    f"pulled ({engine_client.short(exc, 200)}); set image.base_image or "
                    "HF2TRITON_BASE_IMAGE to a Python 3.11 image the engine has (`bash "
                    "infra/docker-env.sh up` imports one built with debootstrap)")
    return None


# ---- build ----------------------------------------------------------------------------------


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


def _context(ctx: Path, repository: str, model_name: str, version: str, files: dict[str, str],
             wheelhouse: Path) -> None:
    """Build context: Dockerfile, wheelhouse/, model_repository/<model>/<version>/..."""
    shutil.copyfile(DOCKERFILE, ctx / "Dockerfile")
    (ctx / "wheelhouse").mkdir()
    for whl in wheelhouse.iterdir():
        if whl.suffix == ".whl" or whl.suffix == ".txt":
            try:
                os.link(whl, ctx / "wheelhouse" / whl.name)
            except OSError:
                shutil.copyfile(whl, ctx / "wheelhouse" / whl.name)
    src = Path(repository) / model_name
    dst = ctx / "model_repository" / model_name
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
    placed = {(f"{model_name}/1/" + k.removeprefix(f"{version}/")
               if k.startswith(f"{version}/") else f"{model_name}/{k}"): v
              for k, v in hash_files(dst).items()}
    if placed != files:
        bad = sorted(k for k in set(placed) | set(files) if placed.get(k) != files.get(k))
        raise ArtifactError(
            f"files {bad[:5]} of the Triton repository do not match the sha256 recorded for this "
            "release: refusing to build an image from them; re-run the release to rebuild it"
        )


def build_serving_image(
    repository: str,
    model_name: str,
    version: str,
    files: dict[str, str],
    target: ImageTarget,
    lineage: dict[str, str],
    timeout_s: float = 1800,
) -> ImageBuildResult:
    """Build the serving image for one release and tag it `target["tag"]`; no network needed.

    `lineage` fills the image's labels: release, source_id, revision, content_hash, release_key,
    variant, model_name (MLflow) and version (MLflow).

    Example:
        >>> build_serving_image.fn(repo["repository"], "minilm-embedder", "3", repo["files"],
        ...     image_target(spec.image, "minilm-embedder", "3", key), lineage)  # doctest: +SKIP
    """
    logger = step_logger()
    started = time.monotonic()
    wheelhouse = ensure_wheelhouse(logger)
    client = engine_client.engine()
    buildargs = {
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
    work = home() / "work" / lineage["release"]
    work.mkdir(parents=True, exist_ok=True)
    ctx = Path(tempfile.mkdtemp(dir=work, prefix=".image-context.", suffix=".tmp"))
    try:
        try:
            _context(ctx, repository, model_name, version, files, wheelhouse)
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
    return ImageBuildResult(image_id=info["Id"], tag=target["tag"],
                            base_image=target["base_image"], size_bytes=size, labels=labels,
                            seconds=round(time.monotonic() - started, 1))


# ---- push -----------------------------------------------------------------------------------


def registry_auth(image: ImageSpec, registry: str) -> dict[str, str] | None:
    """Credentials for the registry: the spec's Prefect block, else the environment, else none."""
    if image.credentials_block:
        block = load_block(RegistryCredentials, image.credentials_block,
                           "image.credentials_block", RegistryAuthError)
        return {"username": block.username, "password": block.password.get_secret_value(),
                "serveraddress": registry}
    user, password = os.environ.get(ENV_USERNAME), os.environ.get(ENV_PASSWORD)
    if user and password:
        return {"username": user, "password": password, "serveraddress": registry}
    if user or password:
        raise RegistryAuthError(f"set both {ENV_USERNAME} and {ENV_PASSWORD}, or neither")
    return None


def push_serving_image(target: ImageTarget, image: ImageSpec | None = None) -> PushResult:
    """Push `target["tag"]`; returns the digest the registry stored it under.

    Registry and network failures are transient (the task retries them); refused credentials and
    everything else fail at once. Credentials (`registry_auth`) are resolved here, so they are
    never a task parameter, and they go to the engine only, never to a log.
    """
    logger = step_logger()
    auth = registry_auth(image or ImageSpec(), target["registry"])
    started = time.monotonic()
    found = engine_client.push(engine_client.engine(), target["tag"], target["registry"], auth,
                               logger)
    reference = f"{target['repository']}@{found}"
    logger.info("image: pushed %s", reference)
    return PushResult(tag=target["tag"], digest=found, reference=reference,
                      seconds=round(time.monotonic() - started, 1))


def image_tags(built: ImageBuildResult, pushed: PushResult) -> dict[str, str]:
    """The MLflow version tags that name the image serving it."""
    return {"image.reference": pushed["reference"], "image.digest": pushed["digest"],
            "image.tag": pushed["tag"], "image.id": built["image_id"],
            "image.size_bytes": str(built["size_bytes"]), "image.base": built["base_image"]}
