"""The serving image's Dockerfile, rendered from the template infra/Dockerfile for one image
variant and base image Python, and the whole build context but the wheels and the model
(`hf2triton image render`), so it can be read and checked without building it."""

from __future__ import annotations

import json
import string
from pathlib import Path

from hf2triton.image.target import ImageTarget
from hf2triton.image.variants import variant_for
from hf2triton.image.wheelhouse import serving_requirements, write_requirement_lists
from hf2triton.workspace import atomic_write_text, resource_dir

DOCKERFILE = resource_dir("infra") / "Dockerfile"


class _Template(string.Template):
    # `$` and `${...}` are the Dockerfile's and the shell's own.
    delimiter = "%%"


def render_dockerfile(target: ImageTarget, template: Path = DOCKERFILE) -> str:
    """The Dockerfile that builds `target`'s image (its variant, base image and Python)."""
    variant = variant_for(target.get("device"))
    return _Template(template.read_text()).substitute(
        base_image=target["base_image"], python=target["python"],
        description=variant.description, build_lines=variant.build_lines,
        final_lines=variant.final_lines)


def render_context(target: ImageTarget, out: Path) -> list[Path]:
    """Write what the image build reads but the wheels and the model: Dockerfile,
    wheelhouse/triton.txt and runtime.txt (what is installed from the wheelhouse), and
    build-args.json (the build arguments the pipeline passes but the release's lineage)."""
    variant = variant_for(target.get("device"))
    (out / "wheelhouse").mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "Dockerfile", render_dockerfile(target))
    write_requirement_lists(out / "wheelhouse", *serving_requirements(variant))
    atomic_write_text(out / "build-args.json",
                      json.dumps({"BASE_IMAGE": target["base_image"]}, indent=1) + "\n")
    return [out / "Dockerfile", out / "wheelhouse" / "triton.txt",
            out / "wheelhouse" / "runtime.txt", out / "build-args.json"]
