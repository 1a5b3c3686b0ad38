"""The serving image's wheels, downloaded on the host once (the image build itself has no
network): the Triton wheel and the serving runtime pinned in infra/serving-requirements.txt (with
the image variant's swaps: onnxruntime-gpu and its CUDA libraries for the GPU image), for the
image's platform and Python whatever the host's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from hf2triton.errors import ArtifactError, ImageBuildError, ServiceUnavailableError
from hf2triton.image.variants import VARIANTS, ImageVariant
from hf2triton.util.runs import step_logger
from hf2triton.util.workspace import CHECKOUT, cached_step, digest, home, resource_dir

SERVING_REQUIREMENTS = resource_dir("infra") / "serving-requirements.txt"
TRITON_PACKAGE = "nvidia-pytriton"


def pip_platform(python: str) -> list[str]:
    """pip's options for wheels of the image: glibc up to 2.36 (Debian bookworm), CPython
    `python`, x86_64, whatever the host is (pip does not expand manylinux_2_36 to older tags
    itself)."""
    abi = "cp" + python.replace(".", "")
    return [
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
        *[a for m in range(36, 16, -1) for a in ("--platform", f"manylinux_2_{m}_x86_64")],
        "--platform",
        "manylinux2014_x86_64",
    ]


# pip's own words for a download that failed on the network, not on the requirement.
PIP_NETWORK_FAILURES = ("Connection", "timed out", "Temporary failure", "HTTP error 5")


def _name(requirement: str) -> str:
    return re.split(r"[=<>!~\[ ]", requirement)[0].lower()


def serving_requirements(variant: ImageVariant = VARIANTS["cpu"]) -> tuple[list[str], list[str]]:
    """(the Triton wheel, everything else) from infra/serving-requirements.txt, with the
    variant's packages swapped in at the pinned versions."""
    lines = [ln.split("#")[0].strip() for ln in SERVING_REQUIREMENTS.read_text().splitlines()]
    reqs = [ln for ln in lines if ln]
    triton = [r for r in reqs if _name(r) == TRITON_PACKAGE]
    if len(triton) != 1:
        raise ArtifactError(f"{SERVING_REQUIREMENTS} must pin {TRITON_PACKAGE} exactly once")
    runtime = []
    for r in reqs:
        if r in triton:
            continue
        swap = variant.swaps.get(_name(r))
        runtime.append(swap + r[len(_name(r)) :] if swap else r)
    missing = set(variant.swaps) - {_name(r) for r in reqs}
    if missing:
        raise ArtifactError(
            f"{SERVING_REQUIREMENTS} must pin {sorted(missing)}: the "
            f"{variant.device} image installs a replacement at that version"
        )
    return triton, runtime


def write_requirement_lists(out: Path, triton: list[str], runtime: list[str]) -> None:
    """What the Dockerfile installs: triton.txt (the Triton wheel, only its server is kept) and
    runtime.txt (the serving environment)."""
    (out / "triton.txt").write_text("\n".join(triton) + "\n")
    (out / "runtime.txt").write_text("\n".join(runtime) + "\n")


def wheelhouse_root() -> Path:
    """$HF2TRITON_WHEELHOUSE, else .cache/wheelhouse in the checkout (ignored by git), else
    wheelhouse/ in the hf2triton home (an installed package)."""
    default = CHECKOUT / ".cache" / "wheelhouse" if CHECKOUT else home() / "wheelhouse"
    return Path(os.environ.get("HF2TRITON_WHEELHOUSE") or default)


def ensure_wheelhouse(
    logger: Any = None, variant: ImageVariant = VARIANTS["cpu"], python: str | None = None
) -> Path:
    """Download the serving image's wheels once (reused while the requirements stay the same)."""
    logger = logger or step_logger()
    triton, runtime = serving_requirements(variant)
    platform = pip_platform(python or variant.python)
    key = digest(["wheelhouse-v1", triton, runtime, platform])

    def build(out: Path) -> dict:
        pip = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--dest",
            str(out),
            "--disable-pip-version-check",
            *platform,
        ]
        logger.info(
            "image: downloading the serving wheels (%s) into %s",
            ", ".join(triton + runtime),
            out.parent,
        )
        for extra, reqs in ((["--no-deps"], triton), ([], runtime)):
            proc = subprocess.run(
                [*pip, *extra, *reqs], capture_output=True, text=True, timeout=1800
            )
            if proc.returncode != 0:
                tail = " ".join(proc.stderr.strip().splitlines()[-3:])
                # pip reports no status code: its exit code is 1 for every failure.
                err = (
                    ServiceUnavailableError
                    if any(s in tail for s in PIP_NETWORK_FAILURES)
                    else ImageBuildError
                )
                raise err(f"pip could not download the serving wheels {reqs}: {tail}")
        write_requirement_lists(out, triton, runtime)
        return {"wheels": sorted(p.name for p in out.glob("*.whl"))}

    done = cached_step(wheelhouse_root(), "wheels", key, build)
    if done.reused:
        logger.info(
            "image: wheelhouse %s reused (%d wheels)", done.path, len(done.result["wheels"])
        )
    return done.path
