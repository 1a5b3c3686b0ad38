"""What the gate is asked to decide (hf2triton.candidates) and which items a served model is
warmed up and searched with (hf2triton.traffic). The gate itself on real models:
tests/test_steps.py and tests/test_variants.py."""

from __future__ import annotations

import pytest

from hf2triton.candidates import gate_candidates, selection
from hf2triton.spec import QuantizationSpec
from hf2triton.traffic import search_items, warmup_items

VARIANTS = [{"method": "dynamic-int8/qint8/per-channel", "onnx_path": "/x/pc.onnx"},
            {"method": "dynamic-int8/qint8/per-tensor", "onnx_path": "/x/pt.onnx"}]


@pytest.mark.parametrize(("section", "names", "select"), [
    # The spec's variant, then fp32 should it miss the gate: the first that passes ships.
    ({}, ["dynamic-int8/qint8/per-channel", "dynamic-int8/qint8/per-tensor", "fp32"], "first"),
    # No fallback: a variant that misses stops the release.
    ({"fallback_to_fp32": False},
     ["dynamic-int8/qint8/per-channel", "dynamic-int8/qint8/per-tensor"], "first"),
    # A search gates fp32 too, fallback or not, and ships the fastest that passes.
    ({"fallback_to_fp32": False, "search": True},
     ["dynamic-int8/qint8/per-channel", "dynamic-int8/qint8/per-tensor", "fp32"], "fastest"),
])
def test_candidates_are_the_variants_in_order_then_fp32(section, names, select):
    quantization = QuantizationSpec(**section)
    found = gate_candidates(VARIANTS, "/x/model.onnx", quantization)
    assert [c.name for c in found] == names
    assert found[-1].onnx_path == ("/x/model.onnx" if names[-1] == "fp32" else "/x/pt.onnx")
    assert selection(quantization) == select


def test_without_quantization_the_export_is_the_only_candidate():
    quantization = QuantizationSpec(method="none")
    found = gate_candidates([{"method": "none", "onnx_path": "/x/copy.onnx"}], "/x/model.onnx",
                            quantization)
    assert [(c.name, c.onnx_path) for c in found] == [("none", "/x/copy.onnx")]


def test_warmup_is_the_longest_items_and_never_a_blank_one():
    items = ["short", "", "a much longer sentence than the rest", "   ", "medium one",
             "the longest sentence of all the items given here"]
    assert warmup_items(items) == ["a much longer sentence than the rest",
                                   "the longest sentence of all the items given here"]
    assert warmup_items(["", " "]) == []


def test_the_search_sends_the_first_items_that_make_a_request():
    items = ["", *(f"item {i}" for i in range(300))]
    sent = search_items(items)
    assert len(sent) == 256 and sent[0] == "item 0" and "" not in sent
