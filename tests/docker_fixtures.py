"""Session fixtures for the image tests: a Docker engine, a registry on a free port and a base
image built with debootstrap (infra/docker-env.sh), and the serving wheelhouse.

On a machine that runs Docker already, that engine is used. Where no engine can be had the image
tests skip, except under CI=true, where they fail: CI must exercise them.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "infra" / "docker-env.sh"


@dataclass(frozen=True)
class DockerEnv:
    registry: str  # 127.0.0.1:PORT
    base_image: str

    def env(self) -> dict[str, str]:
        """What a release needs to build on the test base and push to the test registry."""
        return {"HF2TRITON_REGISTRY": self.registry, "HF2TRITON_BASE_IMAGE": self.base_image}


@pytest.fixture(scope="session")
def docker_env(tmp_path_factory) -> DockerEnv:
    state = tmp_path_factory.mktemp("docker-env")
    env = {**os.environ, "HF2TRITON_DOCKER_STATE": str(state), "HF2TRITON_REGISTRY_PORT": "0"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=1200
    )
    if proc.returncode != 0:
        message = f"no Docker engine, registry or base image could be had:\n{proc.stderr[-2000:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    values = dict(
        line.removeprefix("export ").split("=", 1)
        for line in proc.stdout.splitlines()
        if "=" in line
    )
    try:
        yield DockerEnv(
            registry=values["HF2TRITON_REGISTRY"], base_image=values["HF2TRITON_BASE_IMAGE"]
        )
    finally:
        subprocess.run(["bash", str(SCRIPT), "down"], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def serving_wheelhouse(docker_env) -> Path:
    from hf2triton.image import ensure_wheelhouse

    return ensure_wheelhouse()


@pytest.fixture(scope="session")
def docker_client(docker_env):
    from hf2triton.clients.docker import engine

    return engine()
