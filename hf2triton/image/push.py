"""Pushing the release's image to its registry with the registry's credentials
(hf2triton.clients.credentials), and reading back the digest it was stored under."""

from __future__ import annotations

import time
from typing import TypedDict

from hf2triton.clients import docker as engine_client
from hf2triton.clients.credentials import DockerAuth, RegistryCredentials, resolve
from hf2triton.image.spec import ImageSpec
from hf2triton.image.target import ImageTarget
from hf2triton.util.runs import step_logger


class PushResult(TypedDict):
    tag: str
    digest: str  # sha256:...
    reference: str  # registry/repository@sha256:...
    seconds: float


def registry_auth(image: ImageSpec, registry: str) -> DockerAuth | None:
    """docker-py's credentials for `registry`: the spec's Prefect block, else the environment,
    else none (an open registry)."""
    found = resolve(RegistryCredentials, image.credentials_block)
    return found.auth_config(registry) if found is not None else None


def push_serving_image(target: ImageTarget, image: ImageSpec | None = None) -> PushResult:
    """Push `target["tag"]`; returns the digest the registry stored it under.

    Registry and network failures are transient (the task retries them); refused credentials and
    everything else fail at once. Credentials (`registry_auth`) are resolved here, so they are
    never a task parameter, and they go to the engine only, never to a log.
    """
    logger = step_logger()
    auth = registry_auth(image or ImageSpec(), target["registry"])
    started = time.monotonic()
    found = engine_client.push(
        engine_client.engine(), target["tag"], target["registry"], auth, logger
    )
    reference = f"{target['repository']}@{found}"
    logger.info("image: pushed %s", reference)
    return PushResult(
        tag=target["tag"],
        digest=found,
        reference=reference,
        seconds=round(time.monotonic() - started, 1),
    )
