"""Render-only (`hf2triton render SPEC --output DIR`): the release's Triton model repository and
its serving image's build context, in one folder, from the steps up to the repository (fetch,
export, quantize, validate, tune where asked, build-repository) with nothing registered and
nothing deployed: for a GPU host, CI, or a review of what a release would serve.

Layout: `DIR/model_repository/<model>/{config.pbtxt, warmup/, 1/...}` (what `tritonserver
--model-repository DIR/model_repository` serves), beside it the image build context as `hf2triton
image render` writes it (Dockerfile, wheelhouse/*.txt, hf2triton_openai/, build-args.json: with
the wheels put in wheelhouse/, `docker build DIR` builds the image), and `DIR/render.json`: what
was rendered, from what, with every file's sha256.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, TypedDict

from hf2triton.errors import ArtifactError
from hf2triton.image import image_target, render_context
from hf2triton.release.record import release_key
from hf2triton.release.results import Built
from hf2triton.spec import ReleaseSpec
from hf2triton.util.workspace import hash_files, hash_mismatch

RENDER_FILE = "render.json"
REPOSITORY_DIR = "model_repository"


class RenderResult(TypedDict):
    output: str  # the folder
    model_repository: str  # DIR/model_repository
    model_name: str
    device: str  # deploy.device
    candidate: str  # the gate's shipped candidate
    runtime: dict[str, Any] | None  # serving.json's runtime
    metrics: dict[str, float]
    instance_count: int
    release_key: str
    files: dict[str, str]  # the repository's files (relative to model_repository/) -> sha256
    image_context: list[str]  # the image build context's files, relative to the folder


def check_output(out: Path) -> None:
    """An existing folder is replaced only when it is an earlier render (or empty)."""
    if out.exists() and (
        not out.is_dir() or any(out.iterdir()) and not (out / RENDER_FILE).is_file()
    ):
        raise ArtifactError(
            f"--output {out} exists and is not an earlier render (no {RENDER_FILE} in it): "
            "name a new or empty folder"
        )


def write_render(spec: ReleaseSpec, built: Built, output: str) -> RenderResult:
    """Copy the release's repository into `output` with its image build context and a
    render.json, the files checked against the sha256 the repository step recorded; the folder
    is assembled under a temporary name and renamed into place."""
    src, val, tuned, repo = built.src, built.val, built.tuned, built.repo
    out = Path(output).resolve()
    check_output(out)
    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        model = repo["model_name"]
        shutil.copytree(Path(repo["repository"]) / model, tmp / REPOSITORY_DIR / model)
        files = hash_files(tmp / REPOSITORY_DIR)
        bad = hash_mismatch(files, repo["files"])
        if bad:
            raise ArtifactError(
                f"files {bad[:5]} of the rendered repository differ from what the repository "
                "step recorded: re-run the render"
            )
        key = release_key(src, repo)
        # The version is MLflow's, given at registration: a render names none.
        target = image_target(spec.image, spec.image_repository, "VERSION", key, spec.deploy.device)
        context = [p.relative_to(tmp).as_posix() for p in render_context(target, tmp)]
        chosen = tuned["chosen"] if tuned else {}
        result = RenderResult(
            output=str(out),
            model_repository=str(out / REPOSITORY_DIR),
            model_name=model,
            device=spec.deploy.device,
            candidate=val["chosen"],
            runtime=val.get("runtime"),
            metrics=dict(val["metrics"]),
            instance_count=int(chosen.get("instance_count", spec.deploy.instance_count)),
            release_key=key,
            files=files,
            image_context=context,
        )
        (tmp / RENDER_FILE).write_text(
            json.dumps({"release": spec.name, **result, "image": target}, indent=1) + "\n"
        )
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result
