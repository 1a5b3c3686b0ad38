"""The serving image's Dockerfile and build context rendered without a Docker engine: the variant's
base image and Python, what the wheelhouse installs, the OpenAI API's package read-only, and no
secret of the environment in any of it."""

from __future__ import annotations

import json
import stat

from hf2triton.image import image_target, render_context, render_dockerfile
from hf2triton.image.spec import ImageSpec


def _target(device: str = "cpu"):
    return image_target(ImageSpec(), "minilm-embedder", "3", "0123456789abcdef" * 4, device)


def test_the_dockerfile_is_the_variants(monkeypatch):
    monkeypatch.delenv("HF2TRITON_BASE_IMAGE", raising=False)
    cpu, gpu = _target("cpu"), _target("gpu")
    assert cpu["base_image"] != gpu["base_image"]
    for target in (cpu, gpu):
        text = render_dockerfile(target)
        assert "%%" not in text  # every placeholder filled
        # The build's default base is the variant's own image, not the other variant's.
        assert f"\nARG BASE_IMAGE={target['base_image']}\n" in text
        other = gpu if target is cpu else cpu
        assert f"ARG BASE_IMAGE={other['base_image']}\n" not in text
        assert target["python"] in text
    assert render_dockerfile(cpu) != render_dockerfile(gpu)


def test_the_build_context_holds_what_the_build_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_planted_secret_token")
    monkeypatch.setenv("HF2TRITON_REGISTRY_PASSWORD", "planted-registry-password")
    target = _target()
    written = render_context(target, tmp_path)
    names = {p.relative_to(tmp_path).as_posix() for p in written}
    assert {
        "Dockerfile",
        "wheelhouse/triton.txt",
        "wheelhouse/runtime.txt",
        "build-args.json",
    } <= names
    api = [p for p in written if p.suffix == ".py"]
    assert api and all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in api)
    assert json.loads((tmp_path / "build-args.json").read_text()) == {
        "BASE_IMAGE": target["base_image"]
    }
    assert "nvidia-pytriton" in (tmp_path / "wheelhouse" / "triton.txt").read_text()
    runtime = (tmp_path / "wheelhouse" / "runtime.txt").read_text()
    assert runtime.strip() and "nvidia-pytriton" not in runtime
    for path in tmp_path.rglob("*"):
        if path.is_file():
            text = path.read_bytes()
            assert b"planted" not in text, path


def test_the_gpu_context_installs_the_gpu_runtime(tmp_path):
    render_context(_target("gpu"), tmp_path)
    assert "onnxruntime-gpu" in (tmp_path / "wheelhouse" / "runtime.txt").read_text()
