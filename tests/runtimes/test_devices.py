"""deploy.device: a GPU release renders KIND_GPU instances, and where its gate cannot run on a
GPU it stops before any work with one line. (Our machines have no GPU: what needs one is run on
a lent GPU machine, see the notes; everything else is tested here.)"""

from __future__ import annotations

import json
import subprocess

import pytest

from hf2triton.errors import SpecError
from hf2triton.release.repository import BATCHING, render_config
from hf2triton.runtimes.devices import DEVICES
from hf2triton.spec import parse_spec
from tests.conftest import ROOT, write_spec

HF2TRITON = str(ROOT / ".venv" / "bin" / "hf2triton")
NO_GPU = DEVICES.load("gpu").gate_problem() is not None  # why the gate cannot use a GPU here


def _knobs(spec) -> dict:
    return {k: getattr(spec.deploy, k) for k in BATCHING}


def _config(tmp_path, **deploy) -> str:
    from hf2triton.kinds.embedding import EmbeddingConfig
    from hf2triton.spec import kind_for

    spec = parse_spec(
        __import__("yaml").safe_load(
            write_spec(
                tmp_path / "s.yaml", **{f"deploy__{k}": v for k, v in deploy.items()}
            ).read_text()
        ),
        base_dir=ROOT / "releases",
    )
    cfg = EmbeddingConfig(pooling="mean", normalize=True, max_length=16)
    return render_config(kind_for(spec), "m", cfg, {"embedding_dim": 8}, _knobs(spec), "")


def test_a_cpu_release_renders_cpu_instances(tmp_path):
    text = _config(tmp_path, instance_count=2)
    assert "count: 2\n    kind: KIND_CPU" in text and "KIND_GPU" not in text


def test_a_gpu_release_renders_gpu_instances_on_the_gpus_named(tmp_path):
    text = _config(tmp_path, device="gpu", gpus=[0, 2], instance_count=2)
    assert "count: 2\n    kind: KIND_GPU\n    gpus: [ 0, 2 ]" in text and "KIND_CPU" not in text
    every = _config(tmp_path, device="gpu")
    assert "kind: KIND_GPU\n  }" in every  # no gpus list: every GPU of the server


def test_a_gpu_release_defaults_to_several_instances_per_gpu(tmp_path):
    """On an H200 eight Python-backend instances served most of 1, 2, 4, 8 and 16. What the
    spec gives still rules, and a CPU release keeps one instance."""
    gpu = _config(tmp_path, device="gpu", instance_count=None)
    assert "count: 8\n    kind: KIND_GPU" in gpu
    # Sub-batches of a dynamic batch sized for the GPU: 64 texts of up to 128 tokens in one run.
    assert _spec(tmp_path, device="gpu").deploy.max_batch_tokens == 8192
    assert _spec(tmp_path).deploy.max_batch_tokens == 512
    assert _spec(tmp_path, device="gpu", max_batch_tokens=256).deploy.max_batch_tokens == 256
    assert "count: 2\n    kind: KIND_GPU" in _config(tmp_path, device="gpu", instance_count=2)
    assert "count: 1\n    kind: KIND_CPU" in _config(tmp_path, instance_count=None)


def _spec(tmp_path, **deploy):
    import yaml

    path = write_spec(tmp_path / "s.yaml", **{f"deploy__{k}": v for k, v in deploy.items()})
    return parse_spec(yaml.safe_load(path.read_text()), base_dir=ROOT / "releases")


def test_the_configuration_search_tries_instances_per_gpu_at_gpu_client_counts(tmp_path):
    from hf2triton.release.tuning import grid

    gpu = _spec(tmp_path, device="gpu", instance_count=None, tuning={"search": True})
    assert gpu.deploy.tuning.execution == [(1, 0), (2, 0), (4, 0), (8, 0)]
    assert gpu.deploy.tuning.clients == [64, 128]
    cells = grid(gpu.deploy.tuning, gpu.deploy)
    assert cells[0]["instance_count"] == 8  # the deploy section's own first
    assert sorted({c["instance_count"] for c in cells}) == [1, 2, 4, 8]
    cpu = _spec(tmp_path, tuning={"search": True})
    assert cpu.deploy.tuning.execution == [(1, 0), (2, 1)] and cpu.deploy.tuning.clients == [16, 64]
    listed = _spec(tmp_path, device="gpu", tuning={"execution": [[3, 2]], "clients": [8]})
    assert listed.deploy.tuning.execution == [(3, 2)] and listed.deploy.tuning.clients == [8]


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU: it can measure there")
def test_a_configuration_search_on_a_gpu_this_machine_lacks_stops_before_any_work(tmp_path):
    from hf2triton.errors import EnvironmentSetupError
    from hf2triton.runtimes.devices import check_gate_device

    spec = _spec(
        tmp_path,
        device="gpu",
        gpu_gate="cpu-numerics",
        instance_count=None,
        tuning={"search": True},
    )
    with pytest.raises(EnvironmentSetupError, match="deploy.tuning.search measures") as err:
        check_gate_device(spec.deploy)
    assert "deploy.tuning.search: false here (then deploy.instance_count, 8, ships)" in str(
        err.value
    )
    check_gate_device(_spec(tmp_path, device="gpu", gpu_gate="cpu-numerics").deploy)  # no search


def test_gpu_instances_share_the_hosts_cores_unless_the_version_sets_threads(monkeypatch):
    """ONNX Runtime's default is a pool of one thread per core in every session: N instances on a
    GPU would start N pools. Each gets the host's cores divided among the model's instances on
    this host (Triton lists every GPU of a KIND_GPU group in the config it hands model.py)."""
    import os

    from hf2triton import serving

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    config = {"instance_group": [{"count": 4, "kind": "KIND_GPU", "gpus": [0, 1]}]}
    assert serving.instances_in(config) == 8
    assert serving.instances_in({"instance_group": [{"count": 3, "kind": "KIND_CPU"}]}) == 3
    assert serving.instances_in({}) == 1
    cuda = {"name": "onnxruntime-cuda", "device": "cuda", "precision": "fp16", "device_id": 0}
    version = {"module": "embedding", "intra_op_threads": 0, "runtime": cuda}
    assert serving.placed(version, gpu=1, instances=8)["runtime"] == {
        **cuda,
        "device_id": 1,
        "threads": 2,
    }
    assert serving.placed(version, gpu=0, instances=64)["runtime"]["threads"] == 1
    pinned = {**version, "runtime": {**cuda, "threads": 6}}
    assert serving.placed(pinned, gpu=0, instances=8)["runtime"]["threads"] == 6
    # A CPU instance, or a CPU runtime, runs as the version says.
    assert serving.placed(version, gpu=None, instances=8) is version
    cpu = {**version, "runtime": {"name": "onnxruntime", "device": "cpu", "precision": "fp32"}}
    assert serving.placed(cpu, gpu=0, instances=8) is cpu


def test_gpus_without_a_gpu_device_are_refused(tmp_path):
    with pytest.raises(SpecError, match=r"deploy.gpus \[0\] needs deploy.device: gpu"):
        _config(tmp_path, gpus=[0])


@pytest.mark.skipif(not NO_GPU, reason="this machine can gate on a GPU: nothing to refuse")
@pytest.mark.e2e
def test_a_gpu_release_without_a_gpu_stops_in_one_line_before_any_work(tmp_path):
    home = tmp_path / "home"
    spec = write_spec(tmp_path / "gpu.yaml", deploy__device="gpu")
    proc = subprocess.run(
        [HF2TRITON, "release", str(spec)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HF2TRITON_HOME": str(home)},
        timeout=300,
    )
    assert proc.returncode == 3, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hf2triton: error: [ENVIRONMENT]"), lines
    assert "deploy.device is gpu" in lines[0] and "deploy.gpu_gate: cpu-numerics" in lines[0]
    assert proc.stdout == ""
    assert not (home / "work").exists()  # no step ran


@pytest.mark.e2e
@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU: Triton would load the version")
def test_a_cpu_triton_refusing_a_gpu_version_is_a_clear_deploy_error(
    tmp_path, monkeypatch, tiny_bert
):
    """A GPU release gated on CPU numerics, deployed to a tritonserver without a GPU: Triton
    refuses the KIND_GPU instances, and the release says so in its own words (not a time-out);
    nothing serves the refused version."""
    from hf2triton.errors import DeployError
    from hf2triton.flows.release import release_model
    from hf2triton.spec import load_spec
    from hf2triton.targets import triton_local
    from tests.conftest import free_port, tiny_spec

    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    spec = load_spec(
        tiny_spec(
            tmp_path / "gpu.yaml",
            tiny_bert,
            ports,
            name="tiny-gpu",
            registry__model_name="tiny-gpu",
            deploy__device="gpu",
            deploy__gpu_gate="cpu-numerics",
            deploy__ready_timeout_s=600,
        )
    )
    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        with pytest.raises(DeployError) as err:
            release_model(spec)
    finally:
        triton_local.stop_server()
    message = str(err.value)
    assert "KIND_GPU" in message and "no GPU" in message, message
    assert "not ready within" not in message  # refused at once, not waited out
    config = next(
        (tmp_path / "home" / "work" / "tiny-gpu" / "repository").glob("*/tiny-gpu/config.pbtxt")
    ).read_text()
    assert "kind: KIND_GPU" in config
    served = json.loads(
        next(
            (tmp_path / "home" / "work" / "tiny-gpu" / "repository").glob(
                "*/tiny-gpu/1/serving.json"
            )
        ).read_text()
    )
    assert served["runtime"]["name"] == "onnxruntime-cuda"  # the GPU runtime, gated on CPU
