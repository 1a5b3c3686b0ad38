"""The serving image's variants, one per `deploy.device`: what the CPU image and the GPU image
differ in (the ONNX Runtime package, the default base image and its Python, the lines that make
CUDA reachable), so the Dockerfile, the wheelhouse and the build ask this table, never the device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ImageVariant:
    """One serving image variant.

    `swaps` replaces a package pinned in infra/serving-requirements.txt by another at the same
    version (the GPU image installs onnxruntime-gpu with its CUDA libraries in place of
    onnxruntime). `build_lines` and `final_lines` are Dockerfile lines the variant adds to the
    build stage and the serving stage.
    """

    device: str
    base_image: str
    python: str
    description: str
    swaps: dict[str, str] = field(default_factory=dict)
    build_lines: str = ""
    final_lines: str = ""


# onnxruntime-gpu 1.31.1 is built for CUDA 13; its `cuda` and `cudnn` extras bring the CUDA 13
# user-space libraries as wheels (cudart, cuBLAS, cuFFT, cuRAND, NVRTC, nvJitLink, cuDNN 9), so
# any base with Python and glibc >= 2.28 runs it; the driver (libcuda.so.1) is what the NVIDIA
# container toolkit mounts at run time when NVIDIA_VISIBLE_DEVICES asks for GPUs.
GPU_BUILD = r"""# The CUDA libraries' wheels keep them in site-packages/nvidia/*/lib: list those
folders for the # dynamic linker (ONNX Runtime's CUDA provider dlopens them by soname).
RUN site=$(/opt/serving/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && ls -d "$site"/nvidia/*/lib > /opt/serving/cuda-libraries.conf \
 && test -s /opt/serving/cuda-libraries.conf \
 && test -f "$site/onnxruntime/capi/libonnxruntime_providers_cuda.so"
"""
GPU_FINAL = r"""# Every library of ONNX Runtime's CUDA provider resolves in the image but the
driver's own # libcuda.so.1, which the NVIDIA container toolkit mounts at run time.
RUN cp /opt/serving/cuda-libraries.conf /etc/ld.so.conf.d/hf2triton-cuda.conf && ldconfig \
 && site=$(/opt/serving/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && if ldd "$site/onnxruntime/capi/libonnxruntime_providers_cuda.so" | grep 'not found' \
      | grep -v 'libcuda\.so\.1'; then \ echo "ONNX Runtime's CUDA provider misses the libraries
      above" >&2; exit 1; fi
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
"""

VARIANTS: dict[str, ImageVariant] = {
    "cpu": ImageVariant(
        device="cpu", base_image="python:3.11-slim-bookworm", python="3.11", description="CPU"
    ),
    "gpu": ImageVariant(
        device="gpu",
        base_image="python:3.12-slim-bookworm",
        python="3.12",
        description="NVIDIA GPU, CUDA 13",
        swaps={"onnxruntime": "onnxruntime-gpu[cuda,cudnn]"},
        build_lines=GPU_BUILD,
        final_lines=GPU_FINAL,
    ),
}

# `python:3.12-slim-bookworm`, `docker.io/library/python:3.12`: the official images name their
# Python in the tag.
PYTHON_TAG = re.compile(r"(?:^|/)python:(3\.\d+)(?:[.\-]|$)")


def variant_for(device: str | None) -> ImageVariant:
    """The image variant for a deploy `device` (None: cpu)."""
    try:
        return VARIANTS[device or "cpu"]
    except KeyError:
        raise ValueError(
            f"no serving image variant for device {device!r}: one of {sorted(VARIANTS)}"
        ) from None


def image_python(base_image: str, python: str | None, variant: ImageVariant) -> str:
    """The serving image's Python ("3.12"): `image.python` when the spec sets it, else the one
    an official python image names in its tag, else the variant's default (the build checks the
    base's python3 against it and stops with a clear message where they differ)."""
    if python:
        return python
    found = PYTHON_TAG.search(base_image)
    return found.group(1) if found else variant.python
