"""The CPU facts recorded with every release's timing: what this machine reports, and the one
line a report shows."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from hf2triton.util.cpu import FEATURES, CpuFeatures, cpu_features, describe


def _flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def test_cpu_features_are_this_machines():
    found = cpu_features()
    assert found["cores"] == (os.cpu_count() or 1)
    assert found["machine"] == platform.machine()
    assert found["model"]  # a name always, from /proc/cpuinfo or the platform
    have = _flags()
    assert found["flags"] == sorted(f for f in FEATURES if f in have)
    assert found["int8_dot_products"] == bool({"avx512_vnni", "avx_vnni", "amx_int8"} & have)


def test_describe_names_the_model_cores_and_features():
    features = CpuFeatures(
        model="AMD EPYC 9654",
        cores=16,
        machine="x86_64",
        flags=["avx2", "avx512_vnni", "fma"],
        int8_dot_products=True,
    )
    assert describe(features) == "AMD EPYC 9654, 16 cores, AVX2, AVX512-VNNI, FMA"


def test_describe_says_when_there_is_no_avx2():
    features = CpuFeatures(
        model="Neoverse-N1", cores=4, machine="aarch64", flags=[], int8_dot_products=False
    )
    assert describe(features) == "Neoverse-N1, 4 cores, no AVX2"
