"""What this machine's CPU can do for int8 and fused kernels: the instruction sets ONNX Runtime's
kernels choose between. Recorded with every release's timing, so a variant choice made on the
release machine can be explained, and re-made on a serving machine that differs."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import TypedDict

# /proc/cpuinfo flag -> what it means for the variants
FEATURES = {
    "avx2": "AVX2",
    "fma": "FMA",
    "avx512f": "AVX-512",
    "avx512_vnni": "AVX512-VNNI (int8 dot products)",
    "avx_vnni": "AVX-VNNI (int8 dot products)",
    "avx512_bf16": "AVX512-BF16",
    "amx_int8": "AMX-INT8 (int8 tiles)",
    "amx_bf16": "AMX-BF16",
}


class CpuFeatures(TypedDict):
    model: str  # /proc/cpuinfo's model name (else the platform's processor or machine)
    cores: int
    machine: str  # "x86_64", "aarch64"
    flags: list[str]  # the FEATURES flags it has
    int8_dot_products: bool


def cpu_features() -> CpuFeatures:
    """Model name, core count and the FEATURES flags this CPU has."""
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "flags" and not flags:
                flags = set(value.split())
            elif key == "model name":
                model = value.strip()
    except OSError:
        pass
    return {
        "model": model,
        "cores": os.cpu_count() or 1,
        "machine": platform.machine(),
        "flags": sorted(f for f in FEATURES if f in flags),
        "int8_dot_products": any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8")),
    }


def describe(features: CpuFeatures) -> str:
    names = [FEATURES[f].split(" (")[0] for f in features["flags"]] or ["no AVX2"]
    return f"{features['model']}, {features['cores']} cores, {', '.join(names)}"
