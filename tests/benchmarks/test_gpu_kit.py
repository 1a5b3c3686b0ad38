"""The GPU check kit (benchmarks/gpu/): pack a GPU release here, carry it in parts, and serve and
measure it where it lands. This machine has no GPU, so the tiny BERT's GPU render is packed and
then checked with `--simulate-cpu` (CPU provider, KIND_CPU): every step but the GPU itself.

ONNX Runtime's CUDA provider cannot exist here, so the installed CPU onnxruntime's own files,
zipped as a wheel, stand in for onnxruntime-gpu's: its largest library takes the CUDA provider
library's path through the kit (taken out of the wheel, compressed, split, hashed, joined and put
back), and numpy 1.26.4 comes from the serving environment the same way. What only a GPU shows
(the CUDA provider in use, GPU utilisation, the fp16 graph's speed there) is left to the run on a
lent machine that benchmarks/gpu/README.md describes."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from importlib.metadata import distributions
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, tiny_spec

pytestmark = pytest.mark.e2e  # renders a release and starts tritonserver (through check.py)

PACK = ROOT / "benchmarks" / "gpu" / "pack.py"
CHECK = ROOT / "benchmarks" / "gpu" / "check.py"
PART_MB = 12


def installed_as_wheel(name: str, site: Path, out: Path) -> Path:
    """An installed distribution's files zipped as a wheel (what pip would have unpacked)."""
    dist = next(d for d in distributions(path=[str(site)]) if d.metadata["Name"].lower() == name)
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    wheel = out / f"{name}-{dist.version}-{tag}-{tag}-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for f in dist.files or []:
            src = Path(str(dist.locate_file(f)))
            if not f.parts or f.parts[0] == ".." or "__pycache__" in f.parts or not src.is_file():
                continue
            z.write(src, str(f))
    return wheel


@pytest.fixture(scope="module")
def serving_python() -> Path:
    """The serving environment's python (numpy<2, onnxruntime, tokenizers): the GPU machine's
    python3 in this test."""
    from hf2triton.targets.triton_local import serving_env

    return serving_env() / "bin" / "python"


@pytest.fixture(scope="module")
def packed(tmp_path_factory, tiny_bert, serving_python) -> dict:
    tmp = tmp_path_factory.mktemp("gpu-kit")
    ports = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    spec = tiny_spec(
        tmp / "tiny.yaml",
        tiny_bert,
        {**ports, "openai": {"port": free_port()}},
        name="tiny-gpu-kit",
        registry__model_name="tiny-gpu-kit",
    )  # pack.py makes it the GPU variant
    site = next(serving_python.parent.parent.glob("lib/python3*/site-packages"))
    python = site.parent.name.removeprefix("python")
    stand_ins = tmp / "wheels"
    stand_ins.mkdir()
    out = tmp / "pack"
    cmd = [
        sys.executable,
        str(PACK),
        f"--spec={spec}",
        f"--output={out}",
        f"--home={tmp / 'home'}",
        f"--part-mb={PART_MB}",
        f"--python={python}",
        f"--ort-wheel={installed_as_wheel('onnxruntime', site, stand_ins)}",
        f"--numpy-wheel={installed_as_wheel('numpy', site, stand_ins)}",
        "--texts=12",
        "--xz-preset=0",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return {
        "out": out,
        "summary": json.loads(done.stdout.strip().splitlines()[-1]),
        "manifest": json.loads((out / "manifest.json").read_text()),
    }


def _check(serving_python: Path, parts: Path, work: Path) -> subprocess.CompletedProcess:
    cmd = [str(serving_python), str(CHECK), "run", f"--parts={parts}", f"--work={work}"]
    return subprocess.run([*cmd, "--simulate-cpu"], capture_output=True, text=True, timeout=600)


def test_the_pack_is_parts_within_the_limit_that_join_to_the_manifests_bundle(packed):
    import hashlib

    manifest, out = packed["manifest"], packed["out"]
    assert manifest["render"]["device"] == "gpu" and manifest["instance_count"] == 8
    assert manifest["render"]["candidate"] == "fp16/fused on onnxruntime-cuda fp16"
    assert len(manifest["parts"]) >= 2 and manifest["join"] == sorted(manifest["join"])
    whole = hashlib.sha256()
    for part in manifest["parts"]:
        data = (out / part["name"]).read_bytes()
        assert len(data) == part["bytes"] <= PART_MB * 1_000_000
        assert hashlib.sha256(data).hexdigest() == part["sha256"]
        whole.update(data)
    assert whole.hexdigest() == manifest["bundle"]["sha256"]
    # The stand-in's largest library travelled apart, as the CUDA provider library does.
    assert manifest["split_library"]["path"].startswith("onnxruntime/capi/")
    assert {"triton.tar.xz", "ort-lib.xz", "repository.tar.gz", "plain-fp32.tar.gz"} <= set(
        manifest["members"]
    )
    assert manifest["texts"] == 12 and manifest["plain_fp32"]["initializers"] > 0


def test_the_check_serves_the_pack_on_a_cpu_as_it_would_on_the_gpu(
    packed, serving_python, tmp_path
):
    done = _check(serving_python, packed["out"], tmp_path / "work")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] and not result["errors"] and result["simulate_cpu"]
    assert result["provider"] == "CPUExecutionProvider" and result["provider_ok"]
    served = {(s["instances"], s["clients"]): s for s in result["served"]}
    assert set(served) == {(1, 4), (1, 8), (8, 4), (8, 8)}
    assert all(s["texts_per_s"] > 0 and s["errors"] == 0 for s in served.values())
    assert all(0 < s["host_cpu_busy"] <= 1 for s in served.values())
    # The server side of each point: every Python-backend stub's CPU, one per instance.
    assert all(len(s["server"]["stub_cores"]) == n for (n, _), s in served.items())
    # The instance sweep names the count that served most at the most clients, and the rendered.
    sweep = result["goals"]["instance_count"]
    assert sweep["value"] == 8 and sweep["best"] in (1, 8) and sweep["at_clients"] == 8
    assert set(sweep["texts_per_s"]) == {"1", "8"} and sweep["met"] is None
    # Served embeddings of every text against PyTorch's, computed where the pack was made.
    assert result["cosine"]["texts"] == 12 and result["cosine"]["min"] > 0.98
    graphs = result["ort"]["graphs"]
    assert graphs["shipped"]["texts_per_s"] > 0 and graphs["shipped"]["io_binding_texts_per_s"] > 0
    assert graphs["plain_fp32"]["provider"] == "CPUExecutionProvider"
    # Batches cut by the served code's own plan: as they come, again, and in the CUDA buckets.
    shipped = graphs["shipped"]
    assert shipped["served_like_runs"] >= 400 and shipped["served_like_cold_texts_per_s"] > 0
    assert shipped["served_like_warm_texts_per_s"] > 0
    assert shipped["served_like_bucketed_cold_texts_per_s"] > 0
    assert shipped["served_like_bucketed_shapes"] < shipped["served_like_shapes"]
    # Every goal is measured; none is judged on a CPU.
    assert all(
        g["value"] is not None and g["met"] is None
        for g in result["goals"].values()
        if g is not result["goals"]["gpu_busy"]
    )
    assert result["goals"]["gpu_busy"]["value"] is None


def test_a_damaged_part_is_refused_naming_it(packed, serving_python, tmp_path):
    part = packed["out"] / "part-01"
    original = part.read_bytes()
    try:
        part.write_bytes(original[:100] + bytes([original[100] ^ 1]) + original[101:])
        done = _check(serving_python, packed["out"], tmp_path / "work")
        assert done.returncode == 2
        assert "part-01: sha256" in done.stderr and "carry it again" in done.stderr
        received = subprocess.run(
            [str(serving_python), str(CHECK), "receive", str(part), f"--into={tmp_path / 'in'}"],
            capture_output=True,
            text=True,
        )
        assert received.returncode == 2 and "part-01: sha256" in received.stderr
        assert part.exists()  # a refused part stays where it came
    finally:
        part.write_bytes(original)
