"""The release's serving image, one module per job: `variants` (CPU or GPU image, by
deploy.device), `target` (where it goes: registry, repository, tag, base image and its Python),
`wheelhouse` (the wheels it installs offline, downloaded on the
host once), `dockerfile` (infra/Dockerfile rendered for a variant; `hf2triton image render`),
`build` (prerequisites, build context with every file's sha256 checked, the
offline build) and `push` (registry credentials, push, digest), all through the Docker engine
(hf2triton.clients.docker); `release` (the image step's skip-or-fail rule and the MLflow tags
that name the pushed image).

Tag: `<registry>/<repository>:<MLflow version>-<first 12 of the release key>`; what runs is the
pushed digest, `<registry>/<repository>@sha256:...`, the same one recorded in MLflow.
"""

from hf2triton.image.build import ImageBuildResult, build_serving_image, check_prerequisites
from hf2triton.image.dockerfile import render_context, render_dockerfile
from hf2triton.image.push import PushResult, push_serving_image, registry_auth
from hf2triton.image.release import image_tags

# targets/docker.py imports the spec's section from here.
from hf2triton.image.spec import ImageSpec
from hf2triton.image.target import ImageTarget, image_target
from hf2triton.image.variants import VARIANTS, ImageVariant, variant_for
from hf2triton.image.wheelhouse import ensure_wheelhouse, wheelhouse_root

__all__ = [
    "VARIANTS",
    "ImageBuildResult",
    "ImageSpec",
    "ImageTarget",
    "ImageVariant",
    "PushResult",
    "build_serving_image",
    "check_prerequisites",
    "ensure_wheelhouse",
    "image_tags",
    "image_target",
    "push_serving_image",
    "registry_auth",
    "render_context",
    "render_dockerfile",
    "variant_for",
    "wheelhouse_root",
]
