"""hf2triton/serving/text.py: texts tokenized, padded per sub-batch and run through one ONNX graph
on a runtime. A hand-written graph (tests/serving/graphs.py: each row's id sum and token count)
shows every row answered as if alone, in request order, whatever the sub-batching."""

from __future__ import annotations

import numpy as np
import pytest

from hf2triton.serving.runtimes import RuntimeSettings
from hf2triton.serving.text import OnnxText, TextModel, plan_sub_batches, truncated
from tests.serving.graphs import expected_logits, sums_graph, tokenizer_file

TEXTS = ["w2 w3", "w4", "w5 w6 w7 w8 w9", "w10 nope", "w2 w2 w2"]
IDS = [[2, 3], [4], [5, 6, 7, 8, 9], [10, 1], [2, 2, 2]]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("text")
    return str(sums_graph(tmp / "model.onnx")), str(tokenizer_file(tmp / "tokenizer.json"))


def logits(text: OnnxText, rows: list[str]) -> np.ndarray:
    return np.stack(text.forward(text.encode(rows), ["logits"], lambda out, mask: out["logits"]))


@pytest.mark.parametrize("budget", [0, 4, 8, 1000])
def test_every_row_is_answered_as_if_alone_in_request_order(files, budget):
    text = OnnxText(*files, max_length=16, max_batch_tokens=budget)
    assert logits(text, TEXTS).tolist() == expected_logits(IDS).tolist()


def test_texts_over_max_length_are_cut_and_say_so(files):
    text = OnnxText(*files, max_length=3)
    encodings = text.encode(TEXTS)
    assert logits(text, TEXTS).tolist() == expected_logits([r[:3] for r in IDS]).tolist()
    assert [bool(t[0]) for t in truncated(encodings)] == [False, False, True, False, False]


def test_the_tokenizers_own_truncation_and_padding_give_way_to_the_models(files, tmp_path):
    from tokenizers import Tokenizer

    saved = Tokenizer.from_file(files[1])
    saved.enable_truncation(max_length=1)
    saved.enable_padding(length=12, pad_id=0, pad_token="[PAD]")
    saved.save(str(tmp_path / "tokenizer.json"))
    text = OnnxText(files[0], str(tmp_path / "tokenizer.json"), max_length=16)
    assert logits(text, TEXTS).tolist() == expected_logits(IDS).tolist()
    assert text.pad_id == 0


def test_a_graph_that_takes_other_inputs_is_refused_naming_them(files, tmp_path):
    odd = sums_graph(tmp_path / "odd.onnx", ("input_ids", "attention_mask", "pixel_values"))
    with pytest.raises(ValueError, match=r"takes inputs \['pixel_values'\] besides token ids"):
        OnnxText(str(odd), files[1], max_length=8)


def test_a_text_model_opens_its_directorys_files_on_the_runtime_named(files):
    import os

    directory = os.path.dirname(files[0])
    runtime = {"name": "onnxruntime", "device": "cpu", "precision": "fp32"}
    model = TextModel.from_directory(directory, {"max_length": 8, "runtime": runtime})
    assert model.text.session.settings == RuntimeSettings(
        "onnxruntime", "cpu", "fp32", {"threads": 0}
    )
    assert model.text.session.in_use == "CPUExecutionProvider"
    assert logits(model.text, TEXTS[:2]).tolist() == expected_logits(IDS[:2]).tolist()


@pytest.mark.parametrize(
    "lengths, budget, groups",
    [
        ([3, 250, 4, 5], 16, [[0, 2, 3], [1]]),
        ([5, 5, 5, 5], 10, [[0, 1], [2, 3]]),
        ([2, 1], 0, [[0, 1]]),
        ([], 8, []),
    ],
)
def test_sub_batches_keep_rows_times_longest_within_the_budget(lengths, budget, groups):
    assert plan_sub_batches(lengths, budget) == groups


def test_a_runtime_that_compiles_per_shape_gets_few_shapes_warmed_and_the_same_answers(files):
    """ONNX Runtime's CUDA provider asks for buckets (pad_to); the CPU session here is told the
    same, and every run it then makes has a bucket's shape, warmed ahead, with unchanged rows."""
    text = OnnxText(*files, max_length=16, max_batch_tokens=8)
    text.session.pad_to = 4
    shapes = text.bucket_shapes()
    assert shapes[:3] == [(1, 4), (2, 4), (4, 4)] and (1, 16) in shapes
    assert all(r & (r - 1) == 0 and w % 4 == 0 for r, w in shapes)
    seen = []
    run = text.session.run
    text.session.run = lambda outputs, feeds: (
        seen.append(feeds["input_ids"].shape) or run(outputs, feeds)
    )
    assert text.warm_buckets() == len(shapes) and seen == shapes
    seen.clear()
    assert logits(text, TEXTS).tolist() == expected_logits(IDS).tolist()
    assert seen and set(seen) <= set(shapes)
    assert text.bucket(5, 7) == (8, 8) and text.bucket(1, 15) == (1, 16)
    text.session.pad_to = 0  # a runtime that does not bucket: each sub-batch as it is
    assert text.bucket(5, 7) == (5, 7) and text.bucket_shapes() == []


def test_the_cuda_runtime_pads_to_32_unless_told_otherwise():
    assert RuntimeSettings("onnxruntime-cuda", "cuda", "fp16").options["pad_to"] == 32
    assert RuntimeSettings("onnxruntime-cuda", "cuda", "fp16", {"pad_to": 0}).options["pad_to"] == 0
    with pytest.raises(ValueError, match="pad_to must be a whole number >= 0"):
        RuntimeSettings("onnxruntime-cuda", "cuda", "fp16", {"pad_to": -1})
