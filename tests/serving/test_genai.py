"""hf2triton/serving/genai.py: text generation on OpenVINO GenAI. What OpenVINO GenAI would not
generate faithfully (logits processors it ignores) is refused before a pipeline is built, naming
the runtimes that serve it; the prompt's log-probability (the gate's perplexity) is scored by a
forward pass of the same IR with the same pinned properties. A hand-written IR with the stateful
model's inputs stands in (its logits favour repeating the current token), so each score is known.
Generation itself, on a real stateful IR, is tests/serving/test_generation.py's."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from hf2triton.serving.causal import Batching
from hf2triton.serving.decoding import DecodeSettings
from hf2triton.serving.genai import GenAIModel, IdleScorer, PromptScorer
from hf2triton.serving.runtimes import RuntimeSettings, RuntimeUnavailable, open_model

V, HIGH = 8, 3.0


def repeat_ir(directory) -> str:
    """openvino_model.xml: logits [1, T, V] with HIGH on each position's own id, 0 elsewhere."""
    import openvino as ov
    from onnx import TensorProto, helper

    from tests.serving.graphs import _save

    i64 = TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["N", "T"]),
        helper.make_tensor_value_info("attention_mask", i64, ["N", "T"]),
        helper.make_tensor_value_info("position_ids", i64, ["N", "T"]),
        helper.make_tensor_value_info("beam_idx", TensorProto.INT32, ["N"]),
    ]
    nodes = [  # every input read (times zero), so the IR keeps them all
        helper.make_node("Mul", ["attention_mask", "position_ids"], ["mp"]),
        helper.make_node("Mul", ["mp", "zero"], ["nothing"]),
        helper.make_node("Add", ["input_ids", "nothing"], ["ids"]),
        helper.make_node("Cast", ["beam_idx"], ["beam"], to=i64),
        helper.make_node("ReduceSum", ["beam"], ["beams"], keepdims=0),
        helper.make_node("Mul", ["beams", "zero"], ["none"]),
        helper.make_node("Add", ["ids", "none"], ["tokens"]),
        helper.make_node("OneHot", ["tokens", "depth", "onoff"], ["logits"], axis=-1),
    ]
    consts = [
        helper.make_tensor("zero", i64, [], [0]),
        helper.make_tensor("depth", i64, [], [V]),
        helper.make_tensor("onoff", TensorProto.FLOAT, [2], [0.0, HIGH]),
    ]
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", "T", V])
    _save(nodes, "repeat", inputs, [out], directory / "model.onnx", consts)
    path = str(directory / "openvino_model.xml")
    ov.save_model(ov.convert_model(str(directory / "model.onnx")), path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    path = repeat_ir(tmp_path_factory.mktemp("genai"))
    return open_model(path, RuntimeSettings("openvino-genai", "cpu", "fp32", {"threads": 1}))


def test_the_prompt_logprob_is_the_sum_over_its_tokens_after_the_first(files):
    scorer = PromptScorer(files)
    same, other = HIGH - math.log(math.exp(HIGH) + V - 1), -math.log(math.exp(HIGH) + V - 1)
    assert scorer([3, 3, 5, 5, 5]) == pytest.approx(3 * same + other, abs=1e-5)
    assert scorer([4]) == 0.0  # nothing to score
    logits = scorer.logits([2, 6])
    assert logits.shape == (2, V) and logits.argmax(axis=-1).tolist() == [2, 6]
    assert scorer([3, 3, 5, 5, 5]) == pytest.approx(3 * same + other, abs=1e-5)  # no state kept


@pytest.mark.parametrize("setting", [{"no_repeat_ngram_size": 3}, {"bad_words_ids": [[4]]}])
def test_processors_it_would_ignore_are_refused_before_a_pipeline_is_built(files, setting):
    model = GenAIModel(files)
    processors = DecodeSettings(0, [0], 0, 16, **setting)
    with pytest.raises(RuntimeUnavailable) as caught:
        model.engine(None, [0], processors, Batching())
    message = str(caught.value)
    assert "does not apply the model's no_repeat_ngram_size or bad_words_ids" in message
    assert "serve it on onnxruntime or openvino" in message


def test_it_says_what_runs_it(files):
    assert GenAIModel(files).in_use == "OpenVINO GenAI CPU f32 (KV cache f32)"
    assert np.isfinite(PromptScorer(files)([1, 2, 3]))


def test_the_scorer_is_freed_when_unused_and_compiled_again_when_asked(files):
    """The scorer's compiled copy of the weights is held only while the gate or the smoke test
    score: freed `idle_s` after its last use (a use in between puts it off), compiled again on
    the next."""
    scoring = IdleScorer(files, idle_s=6.0)
    with scoring.use() as scorer:
        first = scorer([3, 3, 5])
    time.sleep(3)
    with scoring.use() as again:  # used again before it was freed: the same one
        assert again is scorer
    time.sleep(3)
    assert scoring.scorer is scorer  # 6 s after its first use, 3 s after its last: kept
    deadline = time.monotonic() + 10
    while scoring.scorer is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scoring.scorer is None
    with scoring.use() as fresh:
        assert fresh is not scorer and fresh([3, 3, 5]) == pytest.approx(first)
    scoring.close()
    assert scoring.scorer is None and scoring.timer is None
