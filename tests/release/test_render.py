"""Render-only (`hf2triton render SPEC --output DIR`, hf2triton/release/render.py): the release's
steps up to its Triton repository, gate included, for any device and target, on this CPU host;
the folder holds what `tritonserver` serves and the serving image's build context, and nothing
is registered in MLflow or deployed. A GPU spec renders its GPU repository here (its gate checks
the graph's numerics on the CPU); serving it needs a GPU (benchmarks/gpu/ carries it to one)."""

from __future__ import annotations

import collections
import json
import os
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import free_port, new_ports, run_cli, tiny_spec

pytestmark = pytest.mark.e2e  # each runs a release's steps; one starts tritonserver

HF2TRITON = str(Path(sys.executable).parent / "hf2triton")


def _render(spec: Path, out: Path, home: Path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_", "HF2TRITON_", "MLFLOW_"))
    }
    env.update(HF2TRITON_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    return run_cli([HF2TRITON, "render", str(spec), "--output", str(out)], 900, env=env)


def _line(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


def _nothing_registered_or_served(home: Path) -> None:
    """No MLflow store was written (the render reads none for an unlabelled kind either) and no
    Triton of the home runs."""
    assert not (home / "mlflow.db").exists() and not (home / "mlruns").exists()
    assert not (home / "triton" / "server.json").exists()


def test_a_gpu_spec_renders_its_gpu_repository_on_this_cpu_host(tmp_path, tiny_bert):
    import onnx

    spec = tiny_spec(
        tmp_path / "gpu.yaml",
        tiny_bert,
        new_ports(),
        name="tiny-gpu",
        registry__model_name="tiny-gpu",
        deploy__device="gpu",
        deploy__gpu_gate="cpu-numerics",
        deploy__instance_count=None,  # the GPU default
    )
    home, out = tmp_path / "home", tmp_path / "rendered"
    line = _line(_render(spec, out, home))
    assert line["device"] == "gpu" and line["instance_count"] == 8
    assert line["candidate"] == "fp16/fused on onnxruntime-cuda fp16"
    assert "mlflow" not in line and "endpoint" not in line
    model = out / "model_repository" / "tiny-gpu"
    config = (model / "config.pbtxt").read_text()
    assert "count: 8\n    kind: KIND_GPU" in config and "KIND_CPU" not in config
    settings = json.loads((model / "1" / "serving.json").read_text())
    assert settings["runtime"]["name"] == "onnxruntime-cuda"
    assert settings["runtime"]["precision"] == "fp16" and settings["max_batch_tokens"] == 8192
    ops = collections.Counter(n.op_type for n in onnx.load(model / "1" / "model.onnx").graph.node)
    assert ops["Attention"] == 2 and ops["EmbedLayerNormalization"] == 1  # the fused graph
    # render.json: every file of the repository with its sha256, as the folder holds them.
    record = json.loads((out / "render.json").read_text())
    assert record["release"] == "tiny-gpu" and record["runtime"] == settings["runtime"]
    from hf2triton.util.workspace import hash_files

    assert hash_files(out / "model_repository") == record["files"]
    # The image build context of the GPU variant, as `hf2triton image render` writes it.
    assert "onnxruntime-gpu" in (out / "wheelhouse" / "runtime.txt").read_text()
    assert json.loads((out / "build-args.json").read_text())["BASE_IMAGE"].startswith("python:3.12")
    assert "COPY model_repository /models" in (out / "Dockerfile").read_text()
    assert (out / "hf2triton_openai" / "app.py").is_file()
    _nothing_registered_or_served(home)


def _infer(url: str, model: str, text: str) -> np.ndarray:
    import tritonclient.http as httpclient

    with closing(httpclient.InferenceServerClient(url=url)) as client:
        x = httpclient.InferInput("TEXT", [1, 1], "BYTES")
        x.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
        return client.infer(model, [x]).as_numpy("EMBEDDING")[0]


def test_a_cpu_spec_renders_with_its_configuration_search_and_serves(tmp_path, tiny_bert):
    """Tuning where the spec asks (a private tritonserver measures each configuration), the
    chosen instances in config.pbtxt, and the rendered folder serves as it is; a second render
    into it replaces it, a folder that is not a render is refused."""
    from hf2triton.clients.triton import TritonAdmin
    from hf2triton.targets import triton_local
    from hf2triton.util.waiting import wait_for

    spec = tiny_spec(
        tmp_path / "cpu.yaml",
        tiny_bert,
        new_ports(),
        name="tiny-cpu",
        registry__model_name="tiny-cpu",
        deploy__tuning={
            "search": True,
            "execution": [[1, 0], [2, 1]],
            "max_queue_delay_us": [2000],
            "clients": [2],
            "seconds": 1,
        },
    )
    home, out = tmp_path / "home", tmp_path / "rendered"
    line = _line(_render(spec, out, home))
    assert line["device"] == "cpu" and (line["runtime"] or {"device": "cpu"})["device"] == "cpu"
    model = out / "model_repository" / "tiny-cpu"
    config = (model / "config.pbtxt").read_text()
    assert f"count: {line['instance_count']}\n    kind: KIND_CPU" in config
    assert line["instance_count"] in (1, 2)  # what the search chose
    tuned = next((home / "work" / "tiny-cpu" / "tune").glob("*/tuning.json"))
    cells = json.loads(tuned.read_text())  # every configuration, measured
    assert {c["settings"]["instance_count"] for c in cells if c["points"]} == {1, 2}
    _nothing_registered_or_served(home)

    http, grpc, metrics = free_port(), free_port(), free_port()
    proc = triton_local.launch(
        out / "model_repository",
        triton_local.ServerPorts("127.0.0.1", http, grpc, metrics),
        tmp_path / "triton.log",
    )
    try:
        with TritonAdmin(f"127.0.0.1:{http}") as admin:
            wait_for(lambda: admin.model_ready("tiny-cpu"), 180, "tiny-cpu did not load", proc)
        vector = _infer(f"127.0.0.1:{http}", "tiny-cpu", "the rendered repository serves")
        assert vector.shape == (32,) and np.isfinite(vector).all()
    finally:
        triton_local.terminate(proc)

    again = _line(_render(spec, out, home))  # every step reused, the folder replaced
    assert again["release_key"] == line["release_key"]
    other = tmp_path / "not-a-render"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    refused = _render(spec, other, home)
    assert refused.returncode != 0 and "is not an earlier render" in refused.stderr
    assert (other / "notes.txt").read_text() == "mine"
