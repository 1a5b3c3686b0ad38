"""Where the release's image goes (registry, repository, tag) and what it is built on."""

from __future__ import annotations

import os
from typing import NotRequired, TypedDict

from hf2triton.errors import SpecError
from hf2triton.image.spec import REGISTRY_PATTERN, ImageSpec
from hf2triton.image.variants import image_python, variant_for


class ImageTarget(TypedDict):
    registry: str
    repository: str  # registry/repository
    base_image: str
    tag: str  # registry/repository:version-hash
    device: NotRequired[str]  # the image variant (deploy.device); default cpu
    python: NotRequired[str]  # the base image's Python, e.g. "3.12"


def image_target(
    image: ImageSpec, repository: str, version: str, release_key: str, device: str = "cpu"
) -> ImageTarget:
    """Where the image goes and what it is built on; $HF2TRITON_REGISTRY and
    $HF2TRITON_BASE_IMAGE override the spec, and the base defaults to the device variant's."""
    variant = variant_for(device)
    registry = os.environ.get("HF2TRITON_REGISTRY") or image.registry
    if not REGISTRY_PATTERN.match(registry):
        raise SpecError(
            f"HF2TRITON_REGISTRY={registry!r} is not a registry address such as "
            "'registry.example.com:5000' (no scheme, no path): set it so, or unset it to use "
            "image.registry"
        )
    base = os.environ.get("HF2TRITON_BASE_IMAGE") or image.base_image or variant.base_image
    repo = f"{registry}/{repository}"
    return ImageTarget(
        registry=registry,
        repository=repo,
        base_image=base,
        tag=f"{repo}:{version}-{release_key[:12]}",
        device=device,
        python=image_python(base, image.python, variant),
    )
