"""hf2triton/serving/runtimes/openvino.py: OpenVINO on the CPU opens an ONNX graph (or its own IR),
runs it at the precision asked and says so, answers under the file's output names, and its
parallel streams answer several sub-batches as one run each would."""

from __future__ import annotations

import numpy as np
import pytest

from hf2triton.serving.runtimes import (
    RuntimeSettings,
    RuntimeUnavailable,
    open_model,
    runtime_class,
)
from tests.serving.graphs import expected_logits, sums_graph

FEEDS = {
    "input_ids": np.array([[2, 3, 0], [4, 5, 6]]),
    "attention_mask": np.array([[1, 1, 0], [1, 1, 1]]),
}


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return str(sums_graph(tmp_path_factory.mktemp("ov") / "model.onnx"))


def test_it_answers_as_onnxruntime_under_the_files_output_names(graph):
    ov = open_model(graph, RuntimeSettings("openvino", precision="fp32", options={"threads": 1}))
    ort = open_model(graph, RuntimeSettings())
    assert ov.in_use == "OpenVINO CPU f32"
    assert list(ov.outputs) == list(ort.outputs) == ["logits", "hidden"]
    assert list(ov.inputs) == ["input_ids", "attention_mask"]
    assert ov.outputs["logits"].shape == (None, 2)
    for mine, theirs in zip(ov.run(None, FEEDS), ort.run(None, FEEDS)):
        assert np.array_equal(mine, theirs)
    assert ov.run(["logits"], FEEDS)[0].tolist() == expected_logits([[2, 3], [4, 5, 6]]).tolist()


def test_streams_run_sub_batches_side_by_side_each_answered_in_order(graph):
    session = open_model(
        graph, RuntimeSettings("openvino", precision="fp32", options={"streams": 2, "threads": 2})
    )
    assert session.jobs >= 2
    rows = [[i + 2] * (1 + i % 3) for i in range(6)]
    parts = [
        {"input_ids": np.array([r]), "attention_mask": np.ones((1, len(r)), np.int64)} for r in rows
    ]
    got = [out[0][0].tolist() for out in session.run_many(["logits"], parts)]
    assert got == expected_logits(rows).tolist()


def test_its_own_ir_reads_as_the_onnx_file_does(graph, tmp_path):
    import openvino

    openvino.save_model(openvino.convert_model(graph), str(tmp_path / "model.xml"))
    session = open_model(str(tmp_path / "model.xml"), RuntimeSettings("openvino", precision="fp32"))
    assert list(session.outputs) == ["logits", "hidden"]
    assert (
        session.run(["logits"], FEEDS)[0].tolist() == expected_logits([[2, 3], [4, 5, 6]]).tolist()
    )


def test_a_precision_this_cpu_does_not_offer_is_refused_naming_what_it_offers(graph):
    offered = runtime_class("openvino").offered("cpu")
    assert "fp32" in offered["precisions"] and offered["available"]
    missing = [p for p in ("bf16", "fp16") if p not in offered["precisions"]]
    for precision in missing:
        with pytest.raises(
            RuntimeUnavailable, match=f"does not offer {precision}.*choose one of fp32"
        ):
            open_model(graph, RuntimeSettings("openvino", precision=precision))
    for precision in set(offered["precisions"]) - {"fp32"}:  # pinned and read back
        session = open_model(graph, RuntimeSettings("openvino", precision=precision))
        assert session.in_use.endswith({"bf16": "bf16", "fp16": "f16"}[precision])
