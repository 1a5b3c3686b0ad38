"""Image steps: build the release's serving image offline (`infra/Dockerfile`, with the wheels
downloaded on the host first), push it to the image registry, record its digest on the MLflow
model version, and run it blue/green (the `docker` deploy target).

Tag: `<registry>/<repository>:<MLflow version>-<first 12 of the release key>`; what runs is the
pushed digest, `<registry>/<repository>@sha256:...`, the same one recorded in MLflow.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TypedDict

from prefect import task

from hf2triton import docker_target
from hf2triton.errors import (
    ArtifactError,
    DockerUnavailableError,
    ImageBuildError,
    RegistryAuthError,
    RegistryUnavailableError,
    ServiceUnavailableError,
)
from hf2triton.spec import DeploySpec, ImageSpec, ReleaseSpec
from hf2triton.workspace import PROJECT_ROOT, cached_step, digest, hash_files, home
from tasks.common import NO_PREFECT_CACHE, RETRY_TRANSIENT

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


def _logger():
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("hf2triton.image")


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
    logger = logger or _logger()
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
                err = ServiceUnavailableError if any(s in tail for s in (
                    "Connection", "timed out", "Temporary failure", "HTTP error 5")) \
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


def _registry_url(registry: str) -> str:
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    loopback = host in ("localhost", "::1", "[::1]") or host.startswith("127.")
    return f"{'http' if loopback else 'https'}://{registry}/v2/"


def _registry_answers(registry: str) -> str | None:
    """None when the registry speaks the v2 API (401 counts: it wants credentials), else why not."""
    url = _registry_url(registry)
    # A loopback registry is asked directly, never through an HTTP(S)_PROXY of the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({})) \
        if url.startswith("http://") else urllib.request.build_opener()
    try:
        with opener.open(url, timeout=5):
            return None
    except urllib.error.HTTPError as exc:
        return None if exc.code == 401 else f"{url} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"no registry answers at {url} ({getattr(exc, 'reason', exc)})"


def _pull(api, ref: str, logger: Any) -> None:
    repo, _, tag = ref.rpartition(":") if ":" in ref.split("/")[-1] else (ref, "", "latest")
    for chunk in api.pull(repo, tag=tag or "latest", stream=True, decode=True):
        if "error" in chunk:
            raise DockerUnavailableError(chunk["error"])
        if chunk.get("status", "").startswith(("Digest", "Status")):
            logger.info("image: pull %s: %s", ref, chunk["status"])


def check_prerequisites(target: ImageTarget, logger: Any = None) -> str | None:
    """None when the image can be built and pushed here, else the reason it cannot.

    Checks the Docker engine, the registry and the base image (pulled when it is not present).
    """
    logger = logger or _logger()
    try:
        client = docker_target.engine()
    except DockerUnavailableError as exc:
        return str(exc)
    reason = _registry_answers(target["registry"])
    if reason:
        return (f"{reason}; set image.registry (or HF2TRITON_REGISTRY), or start a local one "
                "with `bash infra/docker-env.sh up`")
    import docker.errors

    try:
        client.api.inspect_image(target["base_image"])
    except docker.errors.ImageNotFound:
        logger.info("image: base %s is not on this engine; pulling it", target["base_image"])
        try:
            _pull(client.api, target["base_image"], logger)
        except (docker.errors.APIError, DockerUnavailableError) as exc:
            return (f"base image {target['base_image']} is not on this engine and cannot be "
                    f"pulled ({docker_target._short(exc, 200)}); set image.base_image or "
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
    import docker.errors

    logger = _logger()
    started = time.monotonic()
    wheelhouse = ensure_wheelhouse(logger)
    client = docker_target.engine()
    api = client.api
    api.timeout = timeout_s
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
    image_id, lines = None, []
    try:
        try:
            _context(ctx, repository, model_name, version, files, wheelhouse)
        except OSError as exc:
            raise ArtifactError(f"cannot assemble the build context in {ctx}: {exc}") from None
        logger.info("image: building %s on %s", target["tag"], target["base_image"])
        # network_mode none: the RUN steps get no network at all, so the build is offline by
        # construction, not by luck.
        stream = api.build(path=str(ctx), tag=target["tag"], buildargs=buildargs, rm=True,
                           forcerm=True, pull=False, decode=True, timeout=timeout_s,
                           network_mode="none")
        for chunk in stream:
            if "error" in chunk or "errorDetail" in chunk:
                msg = chunk.get("error") or chunk["errorDetail"].get("message", "?")
                raise ImageBuildError(
                    f"docker build of {target['tag']} failed: {' '.join(msg.split())}. Last "
                    "build output:\n" + "\n".join(lines[-12:])
                )
            text = chunk.get("stream", "").rstrip()
            for line in filter(None, (ln.rstrip() for ln in text.splitlines())):
                lines.append(line)
                # Docker's own bookkeeping lines go to debug; steps and their output to info.
                quiet = line.startswith((" ---> ", "Removing intermediate container"))
                logger.log(logging.DEBUG if quiet else logging.INFO, "image: build: %s", line)
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
    except docker.errors.APIError as exc:
        if exc.is_server_error() and "failed to" not in str(exc).lower():
            raise ServiceUnavailableError(f"the Docker engine failed mid-build: {exc}") from None
        raise ImageBuildError(f"docker build of {target['tag']} failed: {exc}") from None
    except (ConnectionError, OSError) as exc:
        raise ServiceUnavailableError(
            f"the Docker engine stopped answering mid-build: {exc}") from None
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    info = api.inspect_image(image_id or target["tag"])
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
        from hf2triton.docker_target import RegistryCredentials

        try:
            block = RegistryCredentials.load(image.credentials_block)
        except ValueError:
            raise RegistryAuthError(
                f"image.credentials_block {image.credentials_block!r}: no saved "
                "hf2triton-registry-credentials block of that name"
            ) from None
        return {"username": block.username, "password": block.password.get_secret_value(),
                "serveraddress": registry}
    user, password = os.environ.get(ENV_USERNAME), os.environ.get(ENV_PASSWORD)
    if user and password:
        return {"username": user, "password": password, "serveraddress": registry}
    if user or password:
        raise RegistryAuthError(f"set both {ENV_USERNAME} and {ENV_PASSWORD}, or neither")
    return None


_AUTH_WORDS = ("unauthorized", "denied", "authentication required", "no basic auth")
_NET_WORDS = ("connection refused", "timeout", "timed out", "connection reset", "eof",
              "no such host", "503", "502", "504", "500 internal", "i/o timeout",
              "broken pipe", "tls handshake", "server misbehaving")


def _push_error(target: ImageTarget, message: str) -> Exception:
    low = message.lower()
    if any(w in low for w in _AUTH_WORDS):
        return RegistryAuthError(
            f"registry {target['registry']} refused the push of {target['tag']}: {message}. Set "
            f"{ENV_USERNAME}/{ENV_PASSWORD} or image.credentials_block"
        )
    if any(w in low for w in _NET_WORDS):
        return RegistryUnavailableError(
            f"registry {target['registry']} did not take {target['tag']}: {message}")
    return ImageBuildError(f"pushing {target['tag']} failed: {message}")


def push_serving_image(target: ImageTarget, image: ImageSpec | None = None) -> PushResult:
    """Push `target["tag"]`; returns the digest the registry stored it under.

    Registry and network failures are transient (the task retries them); refused credentials and
    everything else fail at once. Credentials (`registry_auth`) are resolved here, so they are
    never a task parameter, and they go to the engine only, never to a log.
    """
    import docker.errors

    logger = _logger()
    auth = registry_auth(image or ImageSpec(), target["registry"])
    started = time.monotonic()
    api = docker_target.engine().api
    repo, tag = target["tag"].rsplit(":", 1)
    found, seen = None, set()
    try:
        for chunk in api.push(repo, tag=tag, stream=True, decode=True, auth_config=auth):
            if "error" in chunk or "errorDetail" in chunk:
                raise _push_error(target, chunk.get("error") or
                                  chunk["errorDetail"].get("message", "?"))
            status, layer = chunk.get("status", ""), chunk.get("id", "")
            if status and status not in ("Pushing", "Preparing", "Waiting") and \
                    (layer, status) not in seen:
                seen.add((layer, status))
                logger.info("image: push: %s%s", f"{layer}: " if layer else "", status)
            aux = chunk.get("aux") or {}
            if aux.get("Digest"):
                found = aux["Digest"]
    except docker.errors.APIError as exc:
        raise _push_error(target, str(exc)) from None
    except (ConnectionError, OSError) as exc:
        raise RegistryUnavailableError(
            f"pushing {target['tag']}: the Docker engine or registry stopped answering: {exc}"
        ) from None
    if not found:
        raise RegistryUnavailableError(f"the push of {target['tag']} reported no digest")
    # Ask the registry (through the engine) what the tag now points at: it must be our digest.
    try:
        stored = api.inspect_distribution(target["tag"], auth_config=auth)["Descriptor"]["digest"]
    except docker.errors.APIError as exc:
        raise _push_error(target, f"could not read the pushed manifest back: {exc}") from None
    if stored != found:
        raise ImageBuildError(
            f"registry {target['registry']} says {target['tag']} is {stored}, the push reported "
            f"{found}: another push raced this one; run the release again"
        )
    reference = f"{target['repository']}@{found}"
    logger.info("image: pushed %s", reference)
    return PushResult(tag=target["tag"], digest=found, reference=reference,
                      seconds=round(time.monotonic() - started, 1))


# ---- record and deploy ----------------------------------------------------------------------


def record_image_tags(model_name: str, version: str, built: ImageBuildResult,
                      pushed: PushResult) -> dict[str, str]:
    """Tag the MLflow model version with the image that serves it."""
    from tasks.register import _call, _client, tracking_uri

    tags = {"image.reference": pushed["reference"], "image.digest": pushed["digest"],
            "image.tag": pushed["tag"], "image.id": built["image_id"],
            "image.size_bytes": str(built["size_bytes"]), "image.base": built["base_image"]}
    uri = tracking_uri()
    client = _client(uri)
    for key, value in tags.items():
        _call("tag the version with its image", uri, client.set_model_version_tag, model_name,
              version, key, value)
    return tags


def _pull_by_digest(reference: str, auth: dict[str, str] | None, logger: Any) -> None:
    """Fetch `repo@sha256:...` from the registry: what runs is what the registry holds."""
    import docker.errors

    api = docker_target.engine().api
    repo, dig = reference.split("@", 1)
    try:
        for chunk in api.pull(repo, tag=dig, stream=True, decode=True, auth_config=auth):
            if "error" in chunk:
                raise _push_error(ImageTarget(registry=repo.split("/")[0], repository=repo,
                                              base_image="", tag=reference), chunk["error"])
    except docker.errors.APIError as exc:
        raise RegistryUnavailableError(f"pulling {reference} failed: {exc}") from None
    logger.info("deploy: pulled %s from the registry", reference)


class ImageDeployResult(TypedDict):
    deployment: docker_target.ContainerDeployResult
    smoke: dict[str, Any]


def deploy_serving_image(
    reference: str,
    release: str,
    model_name: str,
    version: str,
    deploy: DeploySpec,
    reference_path: str,
    min_cosine: float,
    image: ImageSpec | None = None,
) -> ImageDeployResult:
    """Run the pushed image by digest, blue/green, smoke-testing each new container against the
    PyTorch reference; returns the deployment and the smoke figures of the container that serves.
    """
    from tasks.smoke import smoke_test

    logger = _logger()
    _pull_by_digest(reference, registry_auth(image or ImageSpec(), reference.split("/")[0]),
                    logger)

    def check(grpc_url: str, http_url: str):
        result = smoke_test(grpc_url, http_url, model_name, version, reference_path, min_cosine,
                            deploy.max_batch_size)
        logger.info("deploy: smoke on %s passed (%s)", http_url, ", ".join(
            f"{k} {v:.4g}" for k, v in result.items()
            if isinstance(v, float) and not k.endswith("_ms")))
        return result

    dep, smoke = docker_target.deploy_blue_green(reference, release, model_name, version, deploy,
                                                 check, logger)
    if dep["previous"]:
        logger.info("deploy: %s serves version %s on %s; version %s (%s) was removed",
                    dep["container_name"], version, dep["http_url"], dep["previous"]["version"],
                    dep["previous"]["image"])
    return ImageDeployResult(deployment=dep, smoke=dict(smoke))


build_image = task(build_serving_image, name="build-image", **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
push_image = task(push_serving_image, name="push-image", **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
record_image = task(record_image_tags, name="record-image", **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
deploy_image = task(deploy_serving_image, name="deploy-image", **RETRY_TRANSIENT,
                    **NO_PREFECT_CACHE)


def release_image(spec: ReleaseSpec, repository: str, files: dict[str, str], model_name: str,
                  version: str, release_key: str, lineage: dict[str, str]) -> dict[str, Any]:
    """The image part of a release: build, push and record it, or say plainly why it is skipped.

    With `image.build: auto` and target `local-triton`, a missing engine, registry or base image
    skips the image (the summary says why); with `build: true` or target `docker` it fails.
    """
    logger = _logger()
    if spec.image.build is False:
        return {"skipped": "image.build is false"}
    target = image_target(spec.image, spec.image_repository, version, release_key)
    why_not = check_prerequisites(target, logger)
    if why_not:
        if spec.image.build is True or spec.deploy.target in ("docker", "kserve"):
            need = f"deploy.target is {spec.deploy.target}" if spec.deploy.target in (
                "docker", "kserve") else "image.build is true"
            raise DockerUnavailableError(f"the release needs its image ({need}) but {why_not}")
        # The default (image.build auto, target local-triton) needs no image: this is news, not
        # a problem; `image.build: true` turns it into an error.
        logger.info("image: skipped (set image.build: true to require it): %s", why_not)
        return {"skipped": why_not}
    labels = {"release": spec.name, "model_name": model_name, "release_key": release_key,
              **{k: lineage[k] for k in ("source_id", "revision", "content_hash", "variant")}}
    built = build_image(repository, spec.triton_model_name, version, files, target, labels,
                        spec.image.build_timeout_s)
    pushed = push_image(target, spec.image)
    record_image(model_name, version, built, pushed)
    logger.info("image: %s is %.0f MB; %s version %s carries its digest %s", pushed["tag"],
                built["size_bytes"] / 1e6, model_name, version, pushed["digest"])
    return {"reference": pushed["reference"], "digest": pushed["digest"], "tag": pushed["tag"],
            "size_bytes": built["size_bytes"], "size_mb": round(built["size_bytes"] / 1e6, 1),
            "base_image": built["base_image"], "build_seconds": built["seconds"],
            "push_seconds": pushed["seconds"]}
