"""hf2triton/serving/runtimes/onnxruntime.py: ONNX Runtime's CPU provider opens a graph, names its
ports in the file's order with their shapes, and runs feeds (all outputs or those named; several
sub-batches at once), with the threads it is told."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hf2triton.serving.runtimes import RuntimeSettings, open_model
from tests.serving.graphs import expected_logits, sums_graph

FEEDS = {
    "input_ids": np.array([[2, 3, 0], [4, 5, 6]]),
    "attention_mask": np.array([[1, 1, 0], [1, 1, 1]]),
}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    path = sums_graph(tmp_path_factory.mktemp("ort") / "model.onnx")
    return open_model(str(path), RuntimeSettings("onnxruntime", options={"threads": 1}))


def test_ports_in_the_files_order_with_their_shapes(session):
    assert [(p.name, p.shape) for p in session.inputs.values()] == [
        ("input_ids", ("N", "T")),
        ("attention_mask", ("N", "T")),
    ]
    assert list(session.outputs) == ["logits", "hidden"]
    assert session.outputs["logits"].shape == ("N", 2)
    assert session.in_use == "CPUExecutionProvider" and session.max_rows is None
    assert session.session.get_session_options().intra_op_num_threads == 1


def test_runs_answer_all_outputs_or_those_named(session):
    logits, hidden = session.run(None, FEEDS)
    assert logits.tolist() == expected_logits([[2, 3], [4, 5, 6]]).tolist()
    assert hidden.shape == (2, 3, 1)
    (only,) = session.run(["hidden"], FEEDS)
    assert only[:, :, 0].tolist() == [[2, 3, 0], [4, 5, 6]]


def test_sub_batches_and_threads_sharing_a_session_each_get_their_own_answer(session):
    parts = [{k: v[i : i + 1] for k, v in FEEDS.items()} for i in range(2)]
    many = session.run_many(["logits"], parts)
    assert [m[0].tolist() for m in many] == [[[5.0, 20.0]], [[15.0, 30.0]]]
    got: dict[int, list] = {}

    def ask(i: int) -> None:
        for _ in range(20):
            got[i] = session.run(["logits"], parts[i])[0].tolist()

    workers = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert got == {0: [[5.0, 20.0]], 1: [[15.0, 30.0]]}
