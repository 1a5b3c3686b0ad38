"""The serving image's wheels, downloaded on the host once (the image build itself has no
network): the Triton wheel and the serving runtime pinned in infra/serving-requirements.txt, for
the image's platform whatever the host's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from hf2triton.errors import ArtifactError, ImageBuildError, ServiceUnavailableError
from hf2triton.runs import step_logger
from hf2triton.workspace import PROJECT_ROOT, cached_step, digest

SERVING_REQUIREMENTS = PROJECT_ROOT / "infra" / "serving-requirements.txt"
TRITON_PACKAGE = "nvidia-pytriton"
# The image is Debian bookworm (glibc 2.36), CPython 3.11, x86_64, whatever the host is: ask pip
# for wheels of that platform explicitly (it does not expand manylinux_2_36 to older tags itself).
PIP_PLATFORM = [
    "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
    "--abi", "cp311", "--abi", "abi3", "--abi", "none",
    *[a for m in range(36, 16, -1) for a in ("--platform", f"manylinux_2_{m}_x86_64")],
    "--platform", "manylinux2014_x86_64",
]
# pip's own words for a download that failed on the network, not on the requirement.
PIP_NETWORK_FAILURES = ("Connection", "timed out", "Temporary failure", "HTTP error 5")


def _requirements() -> tuple[list[str], list[str]]:
    """(the Triton wheel, everything else) from infra/serving-requirements.txt."""
    lines = [ln.split("#")[0].strip() for ln in SERVING_REQUIREMENTS.read_text().splitlines()]
    reqs = [ln for ln in lines if ln]
    triton = [r for r in reqs if re.split(r"[=<>!~\[ ]", r)[0].lower() == TRITON_PACKAGE]
    if len(triton) != 1:
        raise ArtifactError(f"{SERVING_REQUIREMENTS} must pin {TRITON_PACKAGE} exactly once")
    return triton, [r for r in reqs if r not in triton]


def wheelhouse_root() -> Path:
    """$HF2TRITON_WHEELHOUSE, else .cache/wheelhouse in the project (ignored by git)."""
    return Path(os.environ.get("HF2TRITON_WHEELHOUSE") or PROJECT_ROOT / ".cache" / "wheelhouse")


def ensure_wheelhouse(logger: Any = None) -> Path:
    """Download the serving image's wheels once (reused while the requirements stay the same)."""
    logger = logger or step_logger()
    triton, runtime = _requirements()
    key = digest(["wheelhouse-v1", triton, runtime, PIP_PLATFORM])

    def build(out: Path) -> dict:
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(out),
               "--disable-pip-version-check", *PIP_PLATFORM]
        logger.info("image: downloading the serving wheels (%s) into %s",
                    ", ".join(triton + runtime), out.parent)
        for extra, reqs in ((["--no-deps"], triton), ([], runtime)):
            proc = subprocess.run([*pip, *extra, *reqs], capture_output=True, text=True,
                                  timeout=1800)
            if proc.returncode != 0:
                tail = " ".join(proc.stderr.strip().splitlines()[-3:])
                # pip reports no status code: its exit code is 1 for every failure.
                err = ServiceUnavailableError if any(s in tail for s in PIP_NETWORK_FAILURES) \
                    else ImageBuildError
                raise err(f"pip could not download the serving wheels {reqs}: {tail}")
        (out / "triton.txt").write_text("\n".join(triton) + "\n")
        (out / "runtime.txt").write_text("\n".join(runtime) + "\n")
        return {"wheels": sorted(p.name for p in out.glob("*.whl"))}

    done = cached_step(wheelhouse_root(), "wheels", key, build)
    if done.reused:
        logger.info("image: wheelhouse %s reused (%d wheels)", done.path,
                    len(done.result["wheels"]))
    return done.path
