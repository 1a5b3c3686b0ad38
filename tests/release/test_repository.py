"""The Triton repository a release renders (hf2triton/release/repository.py): the version directory
holds the shared model.py, the whole serving core and the candidate's files; serving.json is the
serving core's (it loads the version back as the gate ran it); config.pbtxt declares what the
served class reads and answers; the same inputs reuse the finished render."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hf2triton import serving
from hf2triton.release.repository import BATCHING, build_repository, render_config
from hf2triton.release.shipped import Shipped
from hf2triton.spec import parse_spec
from tests.conftest import ROOT, write_spec
from tests.tiny_bert_steps import SENTENCES, embedding_kind, saved_apart

OV_F32 = {
    "name": "openvino",
    "device": "cpu",
    "precision": "fp32",
    "streams": 0,
    "hint": "THROUGHPUT",
}


def _knobs(**changes) -> dict:
    spec = parse_spec(
        __import__("yaml").safe_load(write_spec(Path("/tmp") / "repository-spec.yaml").read_text()),
        base_dir=ROOT / "releases",
    )
    return {**{k: getattr(spec.deploy, k) for k in BATCHING}, **changes}


def _shipped(kind, exported, cfg, runtime=None) -> Shipped:
    """The export as the candidate the gate chose (on `runtime`)."""
    return Shipped(
        kind=kind,
        name="fp32",
        path=exported["onnx_path"],
        export_dir=exported["export_dir"],
        config=cfg,
        runtime=runtime,
        info={"embedding_dim": 32},
        metrics={},
    )


def test_a_version_directory_is_what_the_gate_ran(tiny_bert, exported, cfg, tmp_path):
    kind = embedding_kind(tiny_bert)
    built = build_repository(
        _shipped(kind, exported, cfg, OV_F32), "tiny", _knobs(), SENTENCES[:2], str(tmp_path)
    )
    version = Path(built["repository"]) / "tiny" / "1"
    root = Path(serving.__file__).parent
    core = {p.relative_to(root).as_posix() for p in root.rglob("*.py")}
    shipped = version / serving.PACKAGE_DIR
    assert {p.relative_to(shipped).as_posix() for p in shipped.rglob("*.py")} == core
    assert "runtimes/openvino.py" in core  # a subpackage too
    assert {"model.py", "model.onnx", "tokenizer.json", serving.SERVING_FILE} <= {
        p.name for p in version.iterdir()
    }
    settings = serving.read_settings(str(version))
    assert settings["runtime"] == OV_F32 and settings["onnx"] == "model.onnx"
    assert settings["module"] == "embedding" and settings["kind"] == "embedding"
    # Loaded from the directory as Triton loads it, it answers as the gate's in-process model.
    from_dir = serving.load(str(version))
    in_gate = kind.open_candidate(
        exported["onnx_path"],
        exported["export_dir"],
        kind.serving_json(cfg, exported["export_dir"], runtime=OV_F32),
    )
    assert np.allclose(from_dir.embed(SENTENCES), in_gate.embed(SENTENCES), atol=1e-6)
    # Every file is in the result's hashes; the same inputs reuse the render.
    assert "tiny/1/serving.json" in built["files"] and not built["reused"]
    again = build_repository(
        _shipped(kind, exported, cfg, OV_F32), "tiny", _knobs(), SENTENCES[:2], str(tmp_path)
    )
    assert again["reused"] and again["content_hash"] == built["content_hash"]


def test_a_graph_that_keeps_its_weights_outside_itself_ships_them(
    tiny_bert, exported, cfg, tmp_path
):
    """A graph over 2 GB keeps its weights in an external data file (multilingual-e5-large's
    shape: `model.onnx.data` beside its int8 graph); the version directory holds it under the
    name the graph reads, and loads as Triton loads it (a 560M embedder's release failed to
    load without it). The tiny BERT is saved the same way."""

    kind = embedding_kind(tiny_bert)
    graph = saved_apart(exported["onnx_path"], tmp_path / "int8" / "quantized.onnx")
    shipped = replace(_shipped(kind, exported, cfg), path=str(graph))
    built = build_repository(shipped, "tiny", _knobs(), SENTENCES[:2], str(tmp_path / "repo"))
    version = Path(built["repository"]) / "tiny" / "1"
    assert (version / "quantized.onnx.data").is_file()
    assert "tiny/1/quantized.onnx.data" in built["files"]  # hashed with the version
    settings = kind.serving_json(cfg, exported["export_dir"])
    in_gate = kind.open_candidate(str(graph), exported["export_dir"], settings)
    from_dir = serving.load(str(version))
    assert np.allclose(from_dir.embed(SENTENCES), in_gate.embed(SENTENCES), atol=1e-6)


def test_a_graph_whose_weights_lie_outside_its_folder_or_clash_is_refused(exported, tmp_path):
    """External data named outside the graph's folder would not be in the version directory
    (and names a file anywhere on the host), and two graphs' data under one name would make
    one graph read the other's weights: each is refused, naming the file and what to do."""
    import onnx

    from hf2triton.errors import ArtifactError
    from hf2triton.kinds.modality import graph_files, joined_files

    graph = saved_apart(exported["onnx_path"], tmp_path / "g" / "model.onnx")
    assert set(graph_files(str(graph))) == {"model.onnx", "model.onnx.data"}
    model = onnx.load(str(graph), load_external_data=False)
    for t in model.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = "../elsewhere.data"
    moved = tmp_path / "g" / "moved.onnx"
    onnx.save(model, str(moved))
    with pytest.raises(ArtifactError, match=r"keeps tensors in '\.\./elsewhere\.data', outside"):
        graph_files(str(moved))
    other = tmp_path / "h" / "model.onnx.data"
    with pytest.raises(ArtifactError, match=r"'model\.onnx\.data' would be both"):
        joined_files(graph_files(str(graph)), {"model.onnx.data": other})


def test_the_config_declares_the_served_class_inputs_outputs_and_batching(tiny_bert, cfg):
    kind = embedding_kind(tiny_bert)
    text = render_config(
        kind,
        "tiny",
        cfg,
        {"embedding_dim": 32},
        _knobs(max_batch_size=16, preferred_batch_sizes=[4, 16]),
        "",
    )
    assert 'name: "tiny"' in text and "max_batch_size: 16" in text
    assert "preferred_batch_size: [ 4, 16 ]" in text
    for tensor in (*kind.served.inputs, *kind.served.outputs):
        assert f'name: "{tensor.name}"' in text
    assert "dims: [ 32 ]" in text  # the embedding's dimension, a fact of the model
    assert "decoupled" not in text


def test_warmup_requests_are_real_validation_items(tiny_bert, exported, cfg, tmp_path):
    kind = embedding_kind(tiny_bert)
    built = build_repository(
        _shipped(kind, exported, cfg), "tiny", _knobs(), ["hello world"], str(tmp_path)
    )
    model_dir = Path(built["repository"]) / "tiny"
    sample = (model_dir / "warmup" / "sample_0_TEXT.bin").read_bytes()
    assert sample == len(b"hello world").to_bytes(4, "little") + b"hello world"
    assert 'input_data_file: "sample_0_TEXT.bin"' in (model_dir / "config.pbtxt").read_text()
    assert json.loads((model_dir / "1" / serving.SERVING_FILE).read_text())["onnx"] == "model.onnx"
