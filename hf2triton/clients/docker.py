"""The Docker engine and image registries as the release uses them: build, push, pull, and the
containers of the `docker` target. Failures are classified by exception type and status code:
docker-py's `APIError.status_code` (5xx: the engine failed, worth a retry), a refused or dropped
connection (worth a retry), and for the registry its own HTTP answers to the v2 API (no answer or
5xx: unavailable; 401/403: the credentials are refused). Stream errors of a push carry no status,
so the registry is asked directly what went wrong.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hf2triton.clients.credentials import DockerAuth, RegistryCredentials
from hf2triton.errors import (
    DeployError,
    DockerUnavailableError,
    ImageBuildError,
    RegistryAuthError,
    RegistryUnavailableError,
    ServiceUnavailableError,
)

log = logging.getLogger("hf2triton.docker")
CONTAINER_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
# The OpenAI-compatible API the serving image starts beside Triton (when asked).
API_PORT = 9000


def short(exc: BaseException | str, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text[:limit] + ("..." if len(text) > limit else "")


def where() -> str:
    return (
        f"DOCKER_HOST={os.environ['DOCKER_HOST']}"
        if os.environ.get("DOCKER_HOST")
        else "unix:///var/run/docker.sock"
    )


def engine():
    """A client of the Docker engine DOCKER_HOST (or the default socket) names, checked to
    answer."""
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        # docker-py wraps the refused or missing socket; the cause says which.
        cause = exc.__cause__ or exc.__context__
        detail = (
            ""
            if isinstance(cause, (OSError, ConnectionError)) or "Connection" in type(cause).__name__
            else f": {short(exc, 200)}"
        )
        raise DockerUnavailableError(
            f"no Docker engine answers at {where()}{detail}. Start one, or as root run "
            "`bash infra/docker-env.sh up`"
        ) from None
    return client


def engine_error(exc: BaseException, what: str, error: type = ImageBuildError) -> Exception:
    """A docker-py failure as an hf2triton error, by its type and status code."""
    import docker.errors
    import requests

    if isinstance(exc, docker.errors.APIError):
        if exc.is_server_error():
            return ServiceUnavailableError(f"the Docker engine failed to {what}: {short(exc)}")
        return error(f"the Docker engine refused to {what}: {short(exc)}")
    if isinstance(exc, (requests.exceptions.RequestException, ConnectionError, OSError)):
        return ServiceUnavailableError(
            f"the Docker engine stopped answering ({what}): {short(exc)}"
        )
    return error(f"could not {what}: {short(exc)}")


# ---- the registry's own answers -------------------------------------------------------------


def registry_url(registry: str) -> str:
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    loopback = host in ("localhost", "::1", "[::1]") or host.startswith("127.")
    return f"{'http' if loopback else 'https'}://{registry}/v2/"


def _open(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    """(HTTP status, headers) of a GET; status 0 when nothing answers."""
    # A loopback registry is asked directly, never through an HTTP(S)_PROXY of the environment.
    opener = (
        urllib.request.build_opener(urllib.request.ProxyHandler({}))
        if url.startswith("http://")
        else urllib.request.build_opener()
    )
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with opener.open(request, timeout=10) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers or {})
    except (urllib.error.URLError, OSError):
        return 0, {}


def registry_status(registry: str) -> int:
    """The registry's HTTP status for the v2 API root (0: nothing answers). 200 and 401 mean a
    registry answers (401: it wants credentials)."""
    return _open(registry_url(registry))[0]


def registry_answers(registry: str) -> str | None:
    """None when a registry speaks the v2 API here, else why not."""
    status = registry_status(registry)
    if status in (200, 401):
        return None
    url = registry_url(registry)
    return f"no registry answers at {url}" if status == 0 else f"{url} answered HTTP {status}"


def check_credentials(registry: str, auth: DockerAuth | None) -> None:
    """Ask the registry whether it takes `auth` (basic, or the bearer-token flow its 401 names).
    Raises RegistryUnavailableError (no answer, 5xx) or RegistryAuthError (refused, or none
    given where it needs them)."""
    url = registry_url(registry)
    status, headers = _open(url)
    if status == 0 or status >= 500:
        raise RegistryUnavailableError(
            f"registry {registry} did not answer at {url}" + (f" (HTTP {status})" if status else "")
        )
    if status == 200:
        return
    if status not in (401, 403):
        raise RegistryUnavailableError(f"registry {registry} answered HTTP {status} at {url}")
    if auth is None:
        raise RegistryAuthError(
            f"registry {registry} needs credentials: {RegistryCredentials.hint()}"
        )
    basic = "Basic " + base64.b64encode(f"{auth['username']}:{auth['password']}".encode()).decode()
    challenge = next((v for k, v in headers.items() if k.lower() == "www-authenticate"), "")
    if challenge.lower().startswith("bearer"):
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        token_url = f"{params.get('realm', '')}?service={params.get('service', '')}"
        status = _open(token_url, {"Authorization": basic})[0]
    else:
        status = _open(url, {"Authorization": basic})[0]
    if status == 0 or status >= 500:
        raise RegistryUnavailableError(
            f"registry {registry} did not answer the credential check"
            + (f" (HTTP {status})" if status else "")
        )
    if status in (401, 403):
        raise RegistryAuthError(
            f"registry {registry} refused the credentials of user {auth['username']!r} (HTTP "
            f"{status}): give those of a user it accepts: {RegistryCredentials.hint()}"
        )


# ---- images ---------------------------------------------------------------------------------


def pull(client: Any, reference: str, auth: DockerAuth | None = None) -> None:
    """Fetch `repo:tag` or `repo@sha256:...` onto the engine."""
    import docker.errors

    if "@" in reference:
        repo, tag = reference.split("@", 1)
    elif ":" in reference.split("/")[-1]:
        repo, _, tag = reference.rpartition(":")
    else:
        repo, tag = reference, "latest"
    try:
        for chunk in client.api.pull(repo, tag=tag, stream=True, decode=True, auth_config=auth):
            if "error" in chunk:
                registry = repo.split("/")[0]
                if "." in registry or ":" in registry:  # a registry host, not a Hub name
                    check_credentials(registry, auth)  # raises when the registry is the cause
                raise DockerUnavailableError(f"pulling {reference} failed: {short(chunk['error'])}")
    except docker.errors.APIError as exc:
        raise engine_error(exc, f"pull {reference}", DockerUnavailableError) from None


def push(client: Any, tag: str, registry: str, auth: DockerAuth | None, logger: Any = log) -> str:
    """Push `tag`; returns the digest the registry stored it under (read back to be sure).

    Credentials go to the engine only, never to a log."""
    import docker.errors
    import requests

    check_credentials(registry, auth)
    repo, name = tag.rsplit(":", 1)
    found, seen = None, set()
    try:
        for chunk in client.api.push(repo, tag=name, stream=True, decode=True, auth_config=auth):
            if "error" in chunk or "errorDetail" in chunk:
                message = chunk.get("error") or chunk["errorDetail"].get("message", "?")
                check_credentials(registry, auth)  # raises when the registry is the cause
                raise ImageBuildError(f"pushing {tag} failed: {short(message)}")
            status, layer = chunk.get("status", ""), chunk.get("id", "")
            if (
                status
                and status not in ("Pushing", "Preparing", "Waiting")
                and (layer, status) not in seen
            ):
                seen.add((layer, status))
                logger.info("image: push: %s%s", f"{layer}: " if layer else "", status)
            if (chunk.get("aux") or {}).get("Digest"):
                found = chunk["aux"]["Digest"]
    except (docker.errors.APIError, requests.exceptions.RequestException, OSError) as exc:
        check_credentials(registry, auth)
        raise RegistryUnavailableError(f"pushing {tag}: {short(exc)}") from None
    if not found:
        raise RegistryUnavailableError(f"the push of {tag} reported no digest")
    try:
        stored = client.api.inspect_distribution(tag, auth_config=auth)["Descriptor"]["digest"]
    except docker.errors.APIError as exc:
        raise engine_error(
            exc, f"read the pushed manifest of {tag} back", RegistryUnavailableError
        ) from None
    if stored != found:
        raise ImageBuildError(
            f"registry {registry} says {tag} is {stored}, the push reported "
            f"{found}: another push raced this one; run the release again"
        )
    return found


def build(
    client: Any,
    context: str,
    tag: str,
    buildargs: dict[str, str],
    timeout_s: float,
    logger: Any = log,
) -> dict[str, Any]:
    """`docker build` of `context` with no network in its RUN steps; returns the image's
    inspect data."""
    import docker.errors
    import requests

    api = client.api
    api.timeout = timeout_s
    image_id, lines = None, list[str]()
    try:
        # network_mode none: the RUN steps get no network at all, so the build is offline by
        # construction, not by luck.
        for chunk in api.build(
            path=context,
            tag=tag,
            buildargs=buildargs,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
            timeout=timeout_s,
            network_mode="none",
        ):
            if "error" in chunk or "errorDetail" in chunk:
                msg = chunk.get("error") or chunk["errorDetail"].get("message", "?")
                raise ImageBuildError(
                    f"docker build of {tag} failed: {' '.join(msg.split())}. Last build "
                    "output:\n" + "\n".join(lines[-12:])
                )
            text = chunk.get("stream", "").rstrip()
            for line in filter(None, (ln.rstrip() for ln in text.splitlines())):
                lines.append(line)
                # Docker's own bookkeeping lines go to debug; steps and their output to info.
                quiet = line.startswith((" ---> ", "Removing intermediate container"))
                logger.log(logging.DEBUG if quiet else logging.INFO, "image: build: %s", line)
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
        return api.inspect_image(image_id or tag)
    except (docker.errors.APIError, requests.exceptions.RequestException, OSError) as exc:
        raise engine_error(exc, f"build {tag}") from None


# ---- containers -----------------------------------------------------------------------------


def container(client: Any, name: str) -> Any | None:
    import docker.errors

    try:
        return client.containers.get(name)
    except docker.errors.NotFound:
        return None


def remove(found: Any) -> None:
    import docker.errors

    if found is not None:
        try:
            found.remove(force=True)
        except docker.errors.NotFound:
            pass


@dataclass(frozen=True)
class Container:
    """A container of the serving image to run: the image, its name and labels, its environment,
    and whether the engine restarts it (a live one) or not (a candidate)."""

    reference: str
    name: str
    labels: dict[str, str]
    restart: bool
    environment: dict[str, str] = field(default_factory=dict)
    network: str = ""  # a user-defined network to join, as `alias` (a front's)
    alias: str = ""


def run(client: Any, container: Container, host: str, ports: dict[str, int | None]) -> Any:
    """Run the serving image; `ports` by name (CONTAINER_PORTS, and "openai" for the API) to
    the host port on `host` (None: a free one)."""
    return client.containers.run(
        container.reference,
        name=container.name,
        detach=True,
        labels=container.labels,
        environment=container.environment,
        ports={
            f"{({**CONTAINER_PORTS, 'openai': API_PORT})[k]}/tcp": (host, p)
            for k, p in ports.items()
        },
        # The Python backend passes tensors through shared memory; Docker's default 64 MB is tight.
        shm_size="256m",
        restart_policy={"Name": "unless-stopped"} if container.restart else {"Name": "no"},
        **_network(client, container),
    )


def _network(client: Any, container: Container) -> dict[str, Any]:
    """docker-py's arguments that put the container on its network under its alias."""
    if not container.network:
        return {}
    endpoint = client.api.create_endpoint_config(aliases=[container.alias])
    return {"network": container.network, "networking_config": {container.network: endpoint}}


def published(found: Any, host: str) -> dict[str, str]:
    """host:port of each published Triton port of a running container, and of the API's
    ("openai") when it publishes that."""
    found.reload()
    bound = found.attrs["NetworkSettings"]["Ports"] or {}
    out = {}
    for key, port in CONTAINER_PORTS.items():
        entries = bound.get(f"{port}/tcp") or []
        if not entries:
            raise DeployError(f"container {found.name} publishes no port for {key} ({port})")
        out[key] = f"{host}:{entries[0]['HostPort']}"
    api = bound.get(f"{API_PORT}/tcp") or []
    if api:
        out["openai"] = f"{host}:{api[0]['HostPort']}"
    return out


def logs_tail(found: Any, lines: int = 15) -> str:
    try:
        return found.logs(tail=lines).decode("utf-8", "replace").rstrip()
    except Exception:  # noqa: BLE001 - the container may be gone already
        return "(no logs)"


def wait_ready(
    found: Any, ready: Callable[[], bool], model: str, version: str, deadline: float
) -> None:
    """Wait until `ready()` says `model` `version` serves in the container; fail early if the
    container exits."""
    while True:
        found.reload()
        if found.status in ("exited", "dead"):
            code = found.attrs.get("State", {}).get("ExitCode")
            raise DeployError(
                f"container {found.name} exited with code {code} before {model} "
                f"version {version} was ready. Its log ends:\n{logs_tail(found)}"
            )
        if ready():
            return
        if time.monotonic() > deadline:
            raise DeployError(
                f"{model} version {version} was not ready in container {found.name} within the "
                f"deadline (deploy.ready_timeout_s). Its log ends:\n{logs_tail(found)}"
            )
        time.sleep(0.5)
