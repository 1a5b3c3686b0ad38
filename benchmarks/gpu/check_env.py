"""The GPU check's serving environment on the machine: what it offers (probe), a venv of its own
Python with the carried wheels, the library path tritonserver and ONNX Runtime's CUDA provider
need, and the rendered repository's edits (instances, the CPU stand-in)."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from gpu.check_kit import Refused


def probe() -> dict[str, Any]:
    """What the machine offers that the check depends on, read in a second."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        found = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    except OSError:
        found = ""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    smi = shutil.which("nvidia-smi")
    gpus = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout if smi else ""
    return {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        f"libpython{version}_in_ldconfig": f"libpython{version}.so.1.0" in found,
        "gpus": [g for g in gpus.splitlines() if g.strip()],
        "cpus": os.cpu_count(),
        "nvidia_lib_dirs": len(nvidia_lib_dirs()),
    }


def machine_site_packages() -> list[str]:
    return [
        p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()
    ]


def nvidia_lib_dirs() -> list[str]:
    """PyTorch's CUDA libraries (site-packages nvidia/*/lib): ORT's CUDA provider runs on them."""
    found = []
    for site in machine_site_packages():
        found += sorted(str(p) for p in Path(site).glob("nvidia/*/lib") if any(p.glob("*.so*")))
    return found


def serving_env(work: Path, manifest: dict[str, Any]) -> Path:
    """A venv of this machine's Python (the Python-backend stub takes the first python3 on PATH,
    and ignores PYTHONPATH) holding the carried numpy<2 and onnxruntime, with a .pth to this
    machine's site-packages for the rest (tokenizers). Wheels are unzipped: it has no pip."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if version != manifest["python"]:
        raise Refused(
            f"the pack is for Python {manifest['python']} (its stub and wheels); this python3 "
            f"is {version}: pack with --python {version}"
        )
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{version}" / "site-packages"
    for wheel in sorted((work / "bundle" / "wheels").glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
    lib = manifest["split_library"]
    target = site / lib["path"]
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with lzma.open(work / "bundle" / "ort-lib.xz") as src, open(target, "wb") as out:
        for block in iter(lambda: src.read(1 << 20), b""):
            h.update(block)
            out.write(block)
    if h.hexdigest() != lib["sha256"]:
        raise Refused(f"{lib['path']} unpacked does not match the manifest's sha256")
    (site / "machine-site-packages.pth").write_text("\n".join(machine_site_packages()) + "\n")
    return venv


def run_env(venv: Path, triton: Path) -> dict[str, str]:
    keep = ("HOME", "LANG", "TMPDIR", "USER", "CUDA_VISIBLE_DEVICES")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("LC_")}
    env["PATH"] = f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    # The driver's libcuda, where the GPU machines mount it, if ldconfig does not know it.
    driver = [d for d in ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib") if Path(d).is_dir()]
    libs = [str(triton / "nvidia_pytriton.libs"), *nvidia_lib_dirs(), *driver]
    if os.environ.get("LD_LIBRARY_PATH"):
        libs.append(os.environ["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libs)
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def simulate_on_cpu(model_dir: Path) -> None:
    """The GPU repository made to load on a CPU host: KIND_CPU instances, ONNX Runtime's CPU
    provider (the serving core refuses a CUDA runtime that falls back to the CPU)."""
    config = model_dir / "config.pbtxt"
    config.write_text(config.read_text().replace("KIND_GPU", "KIND_CPU"))
    serving = model_dir / "1" / "serving.json"
    settings = json.loads(serving.read_text())
    runtime = settings.get("runtime") or {}
    settings["runtime"] = {
        "name": "onnxruntime",
        "device": "cpu",
        "precision": runtime.get("precision", "fp32"),
    }
    serving.write_text(json.dumps(settings, indent=1))


def set_instances(model_dir: Path, count: int) -> None:
    config = model_dir / "config.pbtxt"
    text, n = re.subn(
        r"(instance_group\s*\[\s*\{\s*count:\s*)\d+", rf"\g<1>{count}", config.read_text()
    )
    if n != 1:
        raise RuntimeError(f"{config} has no instance_group count to set")
    config.write_text(text)
