"""hf2triton/serving/classification.py: a served classifier's labels and scores (softmax, or
sigmoid for a multi-label model), on a hand-written graph whose logits are known
(tests/serving/graphs.py: the row's id sum and its token count x 10)."""

from __future__ import annotations

import numpy as np
import pytest

from hf2triton.serving.classification import Classifier, activate, label_names
from tests.serving.graphs import sums_graph, tokenizer_file


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("classification")
    return str(sums_graph(tmp / "model.onnx")), str(tokenizer_file(tmp / "tokenizer.json"))


def request(*texts: str) -> dict[str, np.ndarray]:
    return {"TEXT": np.array([[t.encode()] for t in texts], np.object_)}


def test_each_text_gets_its_label_softmax_scores_and_whether_it_was_cut(files):
    model = Classifier(
        *files, {"labels": ["ids", "count"], "activation": "softmax", "max_length": 4}
    )
    # "w30": logits (30, 10): "ids"; "w2 w2": (4, 20): "count"; six tokens cut to four
    (first,) = model.answer([request("w30", "w2 w2", "w2 w2 w2 w2 w2 w2")])
    assert first["LABEL"].tolist() == [[b"ids"], [b"count"], [b"count"]]
    want = np.array([[30, 10], [4, 20], [8, 40]], np.float64)
    want = np.exp(want - want.max(axis=1, keepdims=True))
    assert np.allclose(first["SCORES"], want / want.sum(axis=1, keepdims=True), atol=1e-6)
    assert first["TRUNCATED"].tolist() == [[False], [False], [True]]


def test_a_multi_label_model_names_every_label_over_one_half(files):
    model = Classifier(*files, {"labels": ["a", "b"], "activation": "sigmoid", "max_length": 8})
    assert model.probs(["w2"]).shape == (1, 2)
    assert label_names(np.array([[0.9, 0.6], [0.2, 0.4], [0.1, 0.7]]), ["a", "b"], "sigmoid") == [
        "a,b",
        "",
        "b",
    ]
    assert np.allclose(activate(np.array([[0.0, 100.0]]), "sigmoid"), [[0.5, 1.0]])


def test_an_unknown_activation_fails_when_the_model_loads(files):
    with pytest.raises(ValueError, match="unknown activation 'relu'"):
        Classifier(*files, {"labels": ["a", "b"], "activation": "relu", "max_length": 8})


def test_a_request_without_text_is_refused_and_the_others_answered(files):
    model = Classifier(
        *files, {"labels": ["ids", "count"], "activation": "softmax", "max_length": 8}
    )
    missing, good = model.answer([{}, request("w3")])
    assert missing == "the request has no input TEXT"
    assert good["LABEL"].tolist() == [[b"count"]]
