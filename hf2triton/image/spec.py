"""The `image:` section of a release spec: where the serving image is pushed, what it is built
on, and whether the release must build it."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from hf2triton.util.specbase import Strict, matching

# host[:port] of an image registry, and a repository path in it (Docker's reference grammar).
REGISTRY_PATTERN = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]{1,5})?$")
REPOSITORY_PATTERN = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)
# The Python backend stubs of the Triton wheel exist for 3.8 to 3.13.
PYTHON_VERSION_PATTERN = re.compile(r"^3\.(?:[89]|1[0-3])$")


class ImageSpec(Strict):
    """The release's serving image: built offline, pushed to `registry`, tagged
    `<registry>/<repository>:<MLflow version>-<short content hash>`."""

    build: Literal["auto"] | bool = Field(
        "auto",
        description="auto: build and push when a Docker engine, the registry and the base image "
        "can be had, else say why the image step is skipped; true: they must; false: never",
    )
    registry: Annotated[
        str, matching(REGISTRY_PATTERN, "a registry address such as 'registry.example.com:5000'")
    ] = Field("127.0.0.1:5000", description="host[:port]; $HF2TRITON_REGISTRY overrides it")
    repository: str | None = Field(None, description="repository in the registry; default: name")
    base_image: str | None = Field(
        None,
        description="the image's base: Python with its shared libpython and venv; default "
        "python:3.11-slim-bookworm, or python:3.12-slim-bookworm for deploy.device gpu; "
        "$HF2TRITON_BASE_IMAGE overrides it",
    )
    python: (
        Annotated[str, matching(PYTHON_VERSION_PATTERN, "a Python version such as '3.12'")] | None
    ) = Field(
        None,
        description="the base image's Python version (the wheels and the Python backend "
        "stub are chosen for it); default: the one an official python image names in its tag, "
        "else 3.11 (3.12 for deploy.device gpu)",
    )
    credentials_block: str | None = Field(
        None,
        description="name of a saved hf2triton RegistryCredentials Prefect block; without it "
        "$HF2TRITON_REGISTRY_USERNAME and $HF2TRITON_REGISTRY_PASSWORD are used when set",
    )
    build_timeout_s: float = Field(1800, gt=0)

    @field_validator("python", mode="before")
    @classmethod
    def _quoted_python(cls, v: Any) -> Any:
        if isinstance(v, (int, float)):
            raise ValueError(
                f"write the version quoted, e.g. '{v}': YAML reads an unquoted "
                "version as a number (3.10 as 3.1)"
            )
        return v

    @field_validator("repository")
    @classmethod
    def _check_repository(cls, v: str | None) -> str | None:
        if v is not None and not REPOSITORY_PATTERN.match(v):
            raise ValueError(
                f"{v!r} is not an image repository: lower-case path components of letters, "
                "digits and single '.', '_' or '-' separators, joined by '/'"
            )
        return v
