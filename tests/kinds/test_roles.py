"""The roles a kind plays (hf2triton/kinds/roles.py) and what each gives a kind that says nothing
more: the export checks ordinary items and the longest, the smoke test sends items spread over
the length range, the gate ranks by requests per second at batch 32 and judges `requests`, and a
kind without an OpenAI route refuses to translate for one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from hf2triton.kinds.base import Data, ModelKind
from hf2triton.kinds.modality import TextEncoderKind
from hf2triton.kinds.roles import ExportRole, GateRole, OpenAIRole, ServingRole, serving_module
from hf2triton.serving.base import ServedModel
from hf2triton.serving.embedding import Embedder
from tests.kinds.test_modality import _complete


def _probe(smoke: int = 3) -> ModelKind:
    cls = type(
        "RoleProbeKind",
        (TextEncoderKind,),
        {**_complete(TextEncoderKind), "serving_class": Embedder},
    )
    return cls(None, SimpleNamespace(sentences="s.txt", smoke_sentences=smoke))


def test_a_kind_plays_every_role():
    kind = _probe()
    assert all(isinstance(kind, role) for role in (ExportRole, ServingRole, GateRole, OpenAIRole))
    assert (kind.section, kind.onnx_task, kind.thresholds_key) == (
        "probe",
        "probe-task",
        "probe.thresholds",
    )
    assert kind.serving == ("embedding", "Embedder")
    assert serving_module(ServedModel) == "base"


def test_the_export_checks_ordinary_items_and_the_longest_once_each():
    items = [f"text {i}" for i in range(30)] + ["a much longer text " * 3, "text 0"]
    chosen = _probe().export_inputs(Data(items))
    assert chosen[:20] == items[:20]
    assert (
        "a much longer text " * 3 in chosen and len(chosen) == len(set(chosen)) == 21
    )  # the longest but one are among the first


def test_the_smoke_test_sends_items_spread_over_the_length_range():
    items = ["x" * n for n in (5, 1, 9, 3, 7)]
    kind = _probe(smoke=3)
    assert [len(items[i]) for i in kind.smoke_indices(Data(items))] == [1, 5, 9]
    assert [len(items[i]) for i in _probe(smoke=9).smoke_indices(Data(items))] == [1, 3, 5, 7, 9]


class _Counting:
    """A served model that answers every request at once and counts them."""

    def __init__(self) -> None:
        self.answered = 0

    def answer(self, requests: list[dict[str, np.ndarray]]) -> list[dict[str, Any]]:
        self.answered += len(requests)
        return [{} for _ in requests]


def test_the_gate_ranks_by_requests_per_second_at_batch_32():
    model = _Counting()
    figures = _probe().speed(model, ["one", "two"], batch=32)
    assert figures["speed"] == figures["batch_32"] > 0 and figures["batch_1"] > 0
    # a warm-up, then the best of three: 8 single requests a round, one batch of 32
    assert model.answered == (1 + 3 * 8) + (32 + 3 * 32)


def test_what_a_kind_that_says_nothing_more_gets():
    kind, data = _probe(), Data(["a", "bb"], {"gold": [1, 0]})
    assert kind.judging_requests(["a"], reference=None)[0]["TEXT"][0, 0] == b"a"
    assert kind.gate_data(data, cfg={}) is data
    assert kind.labelled_metrics(data) == set() and kind.labelled_scores([], data, {}) == {}
    assert kind.as_reference([1.0]) == [1.0] and kind.from_json([1.0]) == [1.0]
    assert kind.samples([], [], data, {}) == {} and kind.example({}) == ""
    assert kind.served_checks(None, data) == ({}, {})
    assert kind.info(None) == {} and kind.config_values({}, {}) == {}
    assert kind.config_parameters({}) == {}
    assert kind.settings(SimpleNamespace(to_dict=lambda: {"pooling": "cls"}), "") == {
        "pooling": "cls"
    }
    with pytest.raises(NotImplementedError, match="probe has no OpenAI-compatible route"):
        kind.openai_body({})
