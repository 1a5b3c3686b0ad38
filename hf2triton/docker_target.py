"""The `docker` deploy target: the release's serving image, run by digest on this machine's Docker
engine with its ports bound to the spec's host (127.0.0.1 by default), replaced blue/green.

Blue/green with fixed host ports: the new image first runs as a *candidate* on free ports and must
pass readiness and the smoke check there while the old container keeps serving on the spec's
ports. Only then is the old container stopped (kept, renamed `-previous`), the new image started
on the spec's ports and checked again; the old one is removed once the new one passes, and brought
back if it does not. Between stopping the old and the new one answering there is a gap of one
model load (a few seconds), reported as `switch_seconds`.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

from prefect.blocks.core import Block
from pydantic import SecretStr

from hf2triton.errors import (
    DeployError,
    DockerUnavailableError,
    Hf2TritonError,
    ServiceUnavailableError,
)
from hf2triton.spec import DeploySpec

LABEL_RELEASE = "io.hf2triton.release"
LABEL_ROLE = "io.hf2triton.role"
LABEL_VERSION = "io.hf2triton.mlflow.model-version"
LABEL_IMAGE = "io.hf2triton.image"
CONTAINER_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
T = TypeVar("T")

log = logging.getLogger("hf2triton.docker")


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


def engine():
    """A client of the Docker engine DOCKER_HOST (or the default socket) names, checked to answer."""
    try:
        import docker
    except ImportError:  # pragma: no cover - docker is a dependency
        raise DockerUnavailableError("the docker Python package is missing: pip install docker")
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # docker-py raises DockerException, requests or OS errors here
        raise DockerUnavailableError(
            f"no Docker engine answers ({_where()}): {_short(exc)}. Start one, or as root run "
            "`bash infra/docker-env.sh up`"
        ) from None
    return client


def _where() -> str:
    import os

    return f"DOCKER_HOST={os.environ['DOCKER_HOST']}" if os.environ.get("DOCKER_HOST") \
        else "default socket unix:///var/run/docker.sock"


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text[:limit] + ("..." if len(text) > limit else "")


def _names(release: str) -> tuple[str, str, str]:
    # $HF2TRITON_CONTAINER_PREFIX keeps apart releases of the same name sharing one engine
    # (e.g. test sessions side by side).
    import os

    base = f"{os.environ.get('HF2TRITON_CONTAINER_PREFIX') or 'hf2triton'}-{release}"
    return base, f"{base}-candidate", f"{base}-previous"


def _get(client, name: str):
    import docker.errors

    try:
        return client.containers.get(name)
    except docker.errors.NotFound:
        return None


def _remove(container) -> None:
    import docker.errors

    if container is None:
        return
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def logs_tail(container, lines: int = 15) -> str:
    try:
        return container.logs(tail=lines).decode("utf-8", "replace").rstrip()
    except Exception:  # the container may be gone already
        return "(no logs)"


def _run(client, reference: str, name: str, host: str, ports: dict[str, int | None],
         labels: dict[str, str], restart: bool):
    return client.containers.run(
        reference, name=name, detach=True, labels=labels,
        ports={f"{CONTAINER_PORTS[k]}/tcp": (host, p) for k, p in ports.items()},
        # The Python backend passes tensors through shared memory; Docker's default 64 MB is tight.
        shm_size="256m",
        restart_policy={"Name": "unless-stopped"} if restart else {"Name": "no"},
    )


def published(container, host: str) -> dict[str, str]:
    """host:port of each published Triton port of a running container."""
    container.reload()
    bound = container.attrs["NetworkSettings"]["Ports"] or {}
    out = {}
    for key, port in CONTAINER_PORTS.items():
        entries = bound.get(f"{port}/tcp") or []
        if not entries:
            raise DeployError(f"container {container.name} publishes no port for {key} ({port})")
        out[key] = f"{host}:{entries[0]['HostPort']}"
    return out


def wait_ready(container, http_url: str, model: str, version: str, deadline: float) -> None:
    """Wait until `model` `version` is ready in the container; fail early if the container exits."""
    ready = f"http://{http_url}/v2/models/{model}/versions/{version}/ready"
    while True:
        container.reload()
        if container.status in ("exited", "dead"):
            code = container.attrs.get("State", {}).get("ExitCode")
            raise DeployError(
                f"container {container.name} exited with code {code} before {model} version "
                f"{version} was ready. Its log ends:\n{logs_tail(container)}"
            )
        if _http_ok(ready):
            return
        if time.monotonic() > deadline:
            raise DeployError(
                f"{model} version {version} was not ready in container {container.name} within "
                f"the deadline (deploy.ready_timeout_s). Its log ends:\n{logs_tail(container)}"
            )
        time.sleep(0.5)


class ContainerDeployResult(TypedDict):
    container_id: str
    container_name: str
    image: str
    http_url: str
    grpc_url: str
    metrics_url: str
    previous: dict[str, str] | None  # what served before: name, image, version
    switch_seconds: float  # from stopping the old container to the new one answering
    reused: bool


def _labels(release: str, version: str, reference: str, role: str) -> dict[str, str]:
    return {LABEL_RELEASE: release, LABEL_VERSION: version, LABEL_IMAGE: reference,
            LABEL_ROLE: role}


def _recover(client, live_name: str, prev_name: str) -> None:
    """Finish what an interrupted switch left: a `-previous` container without a live one is put
    back; one beside a live container is no longer needed."""
    prev, live = _get(client, prev_name), _get(client, live_name)
    if prev is None:
        return
    if live is None:
        prev.rename(live_name)
        prev.start()
        log.warning("put back container %s that an interrupted deploy had stopped", live_name)
    else:
        _remove(prev)


def deploy_blue_green(
    reference: str,
    release: str,
    model: str,
    version: str,
    deploy: DeploySpec,
    check: Callable[[str, str], T],
    logger: Any = log,
) -> tuple[ContainerDeployResult, T]:
    """Serve image `reference` (repo@sha256:...) for `release`; `check(grpc_url, http_url)` is the
    smoke test each new container must pass. Returns the deployment and the check's result."""
    import docker.errors

    client = engine()
    live_name, cand_name, prev_name = _names(release)
    try:
        _recover(client, live_name, prev_name)
        _remove(_get(client, cand_name))  # a leftover of an interrupted run
        old = _get(client, live_name)
        if old is not None and old.status != "running":
            logger.info("deploy: container %s is %s; replacing it", live_name, old.status)
            _remove(old)
            old = None
        old_info = None if old is None else {
            "name": live_name, "id": old.id[:12], "image": old.labels.get(LABEL_IMAGE, "?"),
            "version": old.labels.get(LABEL_VERSION, "?")}

        if old is not None and old.labels.get(LABEL_IMAGE) == reference:
            urls = published(old, deploy.host)
            wait_ready(old, urls["http"], model, version, time.monotonic() + 10)
            logger.info("deploy: %s already serves %s; checking it", live_name, reference)
            result = check(urls["grpc"], urls["http"])
            return ContainerDeployResult(
                container_id=old.id, container_name=live_name, image=reference,
                http_url=urls["http"], grpc_url=urls["grpc"], metrics_url=urls["metrics"],
                previous=None, switch_seconds=0.0, reused=True), result

        if old is not None:
            # Green: the new image on free ports, checked while the old one keeps serving.
            cand = _run(client, reference, cand_name, deploy.host,
                        {k: None for k in CONTAINER_PORTS},
                        _labels(release, version, reference, "candidate"), restart=False)
            try:
                urls = published(cand, deploy.host)
                logger.info("deploy: candidate %s on %s; %s (version %s) keeps serving",
                            cand_name, urls["http"], live_name, old_info["version"])
                wait_ready(cand, urls["http"], model, version,
                           time.monotonic() + deploy.ready_timeout_s)
                check(urls["grpc"], urls["http"])
            except Hf2TritonError as exc:
                _remove(cand)
                raise type(exc)(
                    f"{exc} -- the new image was removed; container {live_name} (version "
                    f"{old_info['version']}) keeps serving"
                ) from None
            _remove(cand)
            logger.info("deploy: candidate passed; switching %s to version %s", live_name,
                        version)
        switched = time.monotonic()  # the gap clients see: the old one stops, the new one loads
        if old is not None:
            old.stop(timeout=20)
            old.rename(prev_name)

        new = None
        try:
            new = _run(client, reference, live_name, deploy.host,
                       {"http": deploy.http_port, "grpc": deploy.grpc_port,
                        "metrics": deploy.metrics_port},
                       _labels(release, version, reference, "live"), restart=True)
            urls = published(new, deploy.host)
            wait_ready(new, urls["http"], model, version, time.monotonic() + deploy.ready_timeout_s)
            switch_seconds = time.monotonic() - switched
            result = check(urls["grpc"], urls["http"])
        except (Hf2TritonError, docker.errors.APIError) as exc:
            _remove(new if new is not None else _get(client, live_name))
            if old is not None:
                old.rename(live_name)
                old.start()
                put_back = f"; container {live_name} (version {old_info['version']}) was put back"
            else:
                put_back = ""
            if isinstance(exc, docker.errors.APIError):  # e.g. a spec port already taken
                raise DeployError(
                    f"could not run {reference} on {deploy.host} ports {deploy.http_port}/"
                    f"{deploy.grpc_port}/{deploy.metrics_port}: {_short(exc)}{put_back}"
                ) from None
            raise type(exc)(f"{exc}{put_back}") from None
        if old is not None:
            _remove(old)
        return ContainerDeployResult(
            container_id=new.id, container_name=live_name, image=reference,
            http_url=urls["http"], grpc_url=urls["grpc"], metrics_url=urls["metrics"],
            previous=old_info, switch_seconds=round(switch_seconds, 2), reused=False), result
    except docker.errors.APIError as exc:
        if exc.is_server_error():
            raise ServiceUnavailableError(f"the Docker engine failed: {_short(exc)}") from None
        raise DeployError(f"the Docker engine refused: {_short(exc)}") from None
    except (ConnectionError, OSError) as exc:
        raise ServiceUnavailableError(f"the Docker engine did not answer: {_short(exc)}") from None


def status(release: str) -> dict[str, Any]:
    """The live container of a release: name, image, version, state and health."""
    client = engine()
    c = _get(client, _names(release)[0])
    if c is None:
        return {"running": False}
    return {"running": c.status == "running", "name": c.name, "id": c.id[:12],
            "image": c.labels.get(LABEL_IMAGE), "version": c.labels.get(LABEL_VERSION),
            "health": c.attrs.get("State", {}).get("Health", {}).get("Status")}
