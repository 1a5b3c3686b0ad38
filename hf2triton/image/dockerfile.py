"""The serving image's Dockerfile, rendered from the template infra/Dockerfile for one image
variant and base image Python, and the whole build context but the wheels and the model
(`hf2triton image render`), so it can be read and checked without building it."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

from hf2triton.image.target import ImageTarget
from hf2triton.image.variants import variant_for
from hf2triton.image.wheelhouse import serving_requirements, write_requirement_lists
from hf2triton.util.workspace import atomic_write_text, resource_dir

DOCKERFILE = resource_dir("infra") / "Dockerfile"


class _Template(string.Template):
    # `$` and `${...}` are the Dockerfile's and the shell's own.
    delimiter = "%%"


def render_dockerfile(target: ImageTarget, template: Path = DOCKERFILE) -> str:
    """The Dockerfile that builds `target`'s image (its variant, base image and Python)."""
    variant = variant_for(target.get("device"))
    return _Template(template.read_text()).substitute(
        base_image=target["base_image"],
        python=target["python"],
        description=variant.description,
        build_lines=variant.build_lines,
        final_lines=variant.final_lines,
    )


def write_api_package(out: Path) -> list[Path]:
    """The OpenAI-compatible API's package as the image runs it (`hf2triton_openai/`, files
    0644: the runtime user reads it, cannot change it)."""
    from hf2triton import openai_api

    dst = out / openai_api.PACKAGE_DIR
    dst.mkdir(parents=True, exist_ok=True)
    dst.chmod(0o755)
    written = []
    for module in sorted(Path(openai_api.__file__).parent.glob("*.py")):
        shutil.copyfile(module, dst / module.name)
        (dst / module.name).chmod(0o644)
        written.append(dst / module.name)
    return written


def render_context(target: ImageTarget, out: Path) -> list[Path]:
    """Write what the image build reads but the wheels and the model: Dockerfile,
    wheelhouse/triton.txt and runtime.txt (what is installed from the wheelhouse), the
    OpenAI-compatible API's package and build-args.json (the build arguments the pipeline
    passes but the release's lineage)."""
    variant = variant_for(target.get("device"))
    (out / "wheelhouse").mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "Dockerfile", render_dockerfile(target))
    write_requirement_lists(out / "wheelhouse", *serving_requirements(variant))
    api = write_api_package(out)
    atomic_write_text(
        out / "build-args.json", json.dumps({"BASE_IMAGE": target["base_image"]}, indent=1) + "\n"
    )
    return [
        out / "Dockerfile",
        out / "wheelhouse" / "triton.txt",
        out / "wheelhouse" / "runtime.txt",
        *api,
        out / "build-args.json",
    ]
