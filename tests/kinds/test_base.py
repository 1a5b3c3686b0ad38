"""The kinds' registry and interface (hf2triton/kinds/base.py): every registered kind names its
serving class once, as the class itself; serving.json's (module, class) pair is derived from it
and loads that class back; the class declares every input the kind's requests send and every
output the kind reads of an answer (Triton's and the OpenAI-compatible API's alike); and a kind
whose serving class is not one of the serving core's is refused when its class is made."""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from hf2triton import kinds
from hf2triton.kinds.base import KINDS, ModelKind
from hf2triton.kinds.classification import ClassificationConfig
from hf2triton.kinds.modality import TextEncoderKind
from hf2triton.serving.base import ServedModel, Tensor
from hf2triton.serving.embedding import Embedder
from tests.tiny_models import PHOTOS

VALIDATION = SimpleNamespace(sentences="unused.txt", smoke_sentences=4)

# One validation item of each kind, as its read_data gives them.
ITEMS: dict[str, Any] = {
    "feature-extraction": "the quick brown fox",
    "text-classification": "the quick brown fox",
    "text-ranking": ("what is a fox?", ["a fox is an animal", "the sky is blue"]),
    "translation": "the quick brown fox",
    "text-generation": "Once upon a time",
    "image-classification": str(PHOTOS / "coffee.jpg"),
    "image-text-embedding": {"image": str(PHOTOS / "coffee.jpg")},
    "automatic-speech-recognition": str(PHOTOS.parent / "speech-sentences.txt"),
}

# What each route of the OpenAI-compatible API answers (one item), for the kinds that have one.
OPENAI_BODIES: dict[str, Any] = {
    "/embeddings": {"data": [{"index": 0, "embedding": [0.5, 0.5]}]},
    "/predict": [[{"label": "a", "score": 0.75}, {"label": "b", "score": 0.25}]],
    "/audio/transcriptions": {"text": " hello", "language": "en", "duration": 2.5},
    "/rerank": {
        "results": [{"index": 1, "relevance_score": 0.2}, {"index": 0, "relevance_score": 0.9}]
    },
    "/completions": {
        "choices": [{"text": " there", "token_ids": [5, 6], "finish_reason": "length"}],
        "usage": {"prompt_tokens": 4},
    },
}


def _kind(cls: type[ModelKind]) -> ModelKind:
    return cls(None, VALIDATION)


def _answer(served: type[ServedModel], rows: int) -> dict[str, np.ndarray]:
    """An answer of `rows` rows shaped as the serving class declares its outputs."""
    types = {"STRING": np.object_, "FP32": np.float32, "INT32": np.int32, "BOOL": bool}
    out = {}
    for t in served.outputs:
        dims = tuple(3 if isinstance(d, str) or d < 0 else d for d in t.dims)
        value = b"x" if t.dtype == "STRING" else 1
        out[t.name] = np.full((rows, *dims), value, dtype=types[t.dtype])
    return out


def test_kinds_are_registered_in_the_base_module_and_found_by_their_package():
    assert kinds.KINDS is KINDS
    assert set(KINDS) == set(ITEMS)
    assert kinds.kind_class("translation").__module__ == "hf2triton.kinds.translation"
    assert kinds.DEFAULT_TASK == "feature-extraction"


@pytest.mark.parametrize("task", sorted(ITEMS))
def test_the_serving_class_is_named_once_and_loads_back_from_serving_json(task, tmp_path):
    kind = _kind(KINDS[task])
    module, name = kind.serving
    assert kind.served is kind.serving_class
    assert issubclass(kind.served, ServedModel)
    # serving.json names the pair; the serving core imports it as hf2triton.serving.load does.
    assert getattr(importlib.import_module(f"hf2triton.serving.{module}"), name) is kind.served
    (tmp_path / "serving-tokenizer").mkdir()  # the translator's settings read its plan
    (tmp_path / "serving-tokenizer" / "plan.json").write_text("{}")
    cfg = SimpleNamespace(
        to_dict=dict, max_input_length=8, decode={}, target_langs={}, max_new_tokens_limit=4
    )
    settings = kind.serving_json(cfg, str(tmp_path))
    assert (settings["module"], settings["class"], settings["kind"]) == (module, name, kind.name)
    assert kind.outputs == tuple(t.name for t in kind.served.outputs)


@pytest.mark.parametrize("task", sorted(ITEMS))
def test_the_serving_class_declares_what_the_kind_sends_and_reads(task):
    kind = _kind(KINDS[task])
    declared = {t.name: t for t in kind.served.inputs}
    required = {name for name, t in declared.items() if not t.optional}
    requests = [*kind.requests([ITEMS[task]]), *kind.judging_requests([ITEMS[task]], [{"ids": []}])]
    for request in requests:
        assert set(request) <= set(declared), f"{task} sends inputs its serving class lacks"
        assert required <= set(request), f"{task} leaves out required inputs"
    # What the kind reads of an answer is all there in an answer shaped as the class declares.
    extracted = kind.extract([_answer(kind.served, 1)])
    assert len(extracted if not isinstance(extracted, dict) else extracted["labels"]) == 1


@pytest.mark.parametrize("task", sorted(t for t, c in KINDS.items() if c.openai_route is not None))
def test_the_openai_answer_is_a_triton_answer_of_the_serving_class(task):
    kind = _kind(KINDS[task])
    request = kind.requests([ITEMS[task]])[0]
    body = kind.openai_body(request)
    assert isinstance(body, dict) and body
    cfg = ClassificationConfig(labels=["a", "b"], max_length=8, activation="softmax")
    answer = kind.openai_answer(OPENAI_BODIES[kind.openai_route], request, cfg)
    assert set(answer) <= set(kind.outputs)
    assert kind.extract([answer]) is not None


def test_a_serving_class_outside_the_serving_core_is_refused_when_the_kind_is_made():
    class Elsewhere(ServedModel):
        inputs = (Tensor("TEXT", "STRING"),)

    with pytest.raises(TypeError, match="serving core loads classes of hf2triton.serving only"):
        type(
            "StrayKind",
            (TextEncoderKind,),
            {"name": "stray", "task": "stray", "serving_class": Elsewhere},
        )
    with pytest.raises(TypeError, match="is not a serving class"):
        type(
            "NamedKind",
            (TextEncoderKind,),
            {"name": "named", "task": "named", "serving_class": "Embedder"},
        )
    with pytest.raises(TypeError, match="StrayKind.serving_class"):
        type("StrayKind", (TextEncoderKind,), {"name": "stray", "task": "stray"})
    made = type(
        "ProbeKind",
        (TextEncoderKind,),
        {"name": "probe", "task": "probe-task", "serving_class": Embedder},
    )
    assert (made.section, made.thresholds_key, made.onnx_task) == (
        "probe",
        "probe.thresholds",
        "probe-task",
    )
    assert "probe-task" not in KINDS  # made, not registered
