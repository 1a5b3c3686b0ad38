"""What every kind reads (hf2triton/kinds/data.py): validation files refused with the spec key
that named them, the truncation length a model's authors serve with, the tokenizer.json serving
reads, and numpy figures made plain JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hf2triton.errors import SpecError
from hf2triton.kinds.data import (
    Candidate,
    Data,
    model_max_length,
    read_json,
    read_lines,
    save_fast_tokenizer,
    take,
    timing_items,
    to_json,
)


def test_validation_lines_and_the_files_refused(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("one\n\n  \ntwo\n", encoding="utf-8")
    assert read_lines(good, "validation.sentences") == ["one", "two"]
    with pytest.raises(SpecError, match="validation.sentences file .* does not exist"):
        read_lines(tmp_path / "missing.txt", "validation.sentences")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("straße\n".encode("latin-1"))
    with pytest.raises(SpecError, match="is not UTF-8 text .* one of its prompts per line"):
        read_lines(latin, "validation.sentences", "prompts")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n", encoding="utf-8")
    with pytest.raises(SpecError, match="holds no labelled texts: put one per line"):
        read_lines(empty, "classification.labelled", "labelled texts")


def test_the_truncation_length_the_models_authors_serve_with(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 10**30}))
    assert model_max_length(tmp_path) == 512  # the tokenizer's "no limit" is no limit
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    assert model_max_length(tmp_path) == 128
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    assert model_max_length(tmp_path) == 256  # sentence-transformers' own
    assert model_max_length(tmp_path, 64) == 64  # the spec's
    assert model_max_length(tmp_path / "nothing") == 512
    (tmp_path / "broken.json").write_text("{not json")
    assert read_json(tmp_path / "broken.json") is None


def test_the_tokenizer_json_serving_reads_is_beside_the_graph(tiny_bert, tmp_path):
    save_fast_tokenizer(str(tiny_bert), tmp_path)
    assert (tmp_path / "tokenizer.json").read_bytes() == (tiny_bert / "tokenizer.json").read_bytes()


def test_numpy_figures_as_plain_json_and_rows_taken():
    value = {"a": np.float32(0.5), "b": [np.int64(3), (np.arange(2),)], "c": "x"}
    assert json.dumps(to_json(value)) == '{"a": 0.5, "b": [3, [[0, 1]]], "c": "x"}'
    assert take(np.arange(5) * 2, [4, 0]).tolist() == [8, 0]
    assert take(["a", "b", "c"], [2, 2]) == ["c", "c"]


def test_timing_items_are_a_seeded_draw_of_the_data():
    items = [f"item {i}" for i in range(10)]
    drawn = timing_items(items)
    assert len(drawn) == 32 and set(drawn) <= set(items) and drawn == timing_items(items)
    assert timing_items([]) == []


def test_a_candidate_is_gated_on_its_own_runtime_unless_told_another():
    gpu = {"name": "onnxruntime-cuda"}
    cpu = {"name": "onnxruntime"}
    assert Candidate("fp32", "m.onnx", runtime=gpu).gated_runtime == gpu
    assert Candidate("fp32", "m.onnx", runtime=gpu, gate_runtime=cpu).gated_runtime == cpu
    assert len(Data(["a", "b"])) == 2


def test_a_part_or_reordering_of_the_data_keeps_each_items_extra_entries():
    from hf2triton.kinds.data import Data

    data = Data(["a", "b", "c"], {"references": ["A", "B", "C"], "labels": ["x", "y"], "n": 3})
    part = data.part(1, 3)
    assert part.items == ["b", "c"] and part.extra["references"] == ["B", "C"]
    assert part.extra["labels"] == ["x", "y"] and part.extra["n"] == 3  # not one an item
    assert data.part(0, 3) is data
    again = data.reordered([2, 0, 1])
    assert again.items == ["c", "a", "b"] and again.extra["references"] == ["C", "A", "B"]
