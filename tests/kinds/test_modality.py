"""Kinds by input modality (hf2triton/kinds/modality.py): every registered kind derives from the
base of what its requests carry; a kind that lacks a piece is refused when its module is
imported (at registration), not deep in a release; and a new modality's kind is one class over
its base: an image kind's requests carry the image's bytes, its export copies the model's
preprocessor configuration beside the graph, and its version directory holds both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hf2triton.errors import ExportError
from hf2triton.kinds import KINDS, kind_classes
from hf2triton.kinds.base import Data, ModelKind
from hf2triton.kinds.modality import (
    AudioKind,
    TextEncoderKind,
    TextKind,
    TextToTextKind,
    VisionKind,
)
from hf2triton.serving.base import ServedModel
from hf2triton.serving.embedding import Embedder
from hf2triton.util.plugins import Registry


def test_every_registered_kind_has_a_modality_base():
    bases = {
        k.task: next(
            b for b in (TextEncoderKind, TextToTextKind, VisionKind, AudioKind) if issubclass(k, b)
        )
        for k in kind_classes()
    }
    assert bases == {
        "feature-extraction": TextEncoderKind,
        "text-classification": TextEncoderKind,
        "text-ranking": TextEncoderKind,
        "translation": TextToTextKind,
        "text-generation": TextToTextKind,
        "image-classification": VisionKind,
        "image-text-embedding": VisionKind,
        "automatic-speech-recognition": AudioKind,
    }
    assert {k.modality for k in kind_classes()} == {"text", "image", "audio"}


def _complete(base: type[ModelKind]) -> dict[str, Any]:
    """The kind's own pieces, each trivial: what a new kind module writes."""
    return {
        "name": "probe",
        "task": "probe-task",
        "serving_class": ServedModel,
        "Options": dict,
        "resolve": lambda self, model_dir: {},
        "read_data": lambda self: Data([]),
        "check_export": lambda self, model_dir, out, cfg, inputs: {"max_abs_diff": 0.0},
        "extract": lambda self, answers: answers,
        "reference": lambda self, model_dir, cfg, data: [],
        "config_from_dict": lambda self, data: data,
        "score": lambda self, reference, outputs, data, cfg: ({}, {}),
        "limits": lambda self: {},
        "agreement_limits": lambda self, tolerance: {},
    }


def test_a_kind_that_lacks_a_piece_is_refused_at_registration():
    pieces = _complete(TextEncoderKind)
    del pieces["score"], pieces["limits"], pieces["agreement_limits"]
    incomplete = type("HalfKind", (TextEncoderKind,), pieces)
    with pytest.raises(
        TypeError,
        match="HalfKind cannot be registered: it does not implement "
        "agreement_limits, limits, score",
    ):
        Registry(lambda cls: cls.task, default="probe-task").register(incomplete)
    assert "probe-task" not in KINDS


def test_an_openai_route_without_its_translation_fails_when_the_class_is_made():
    with pytest.raises(TypeError, match="must implement openai_body and openai_answer"):
        type(
            "RoutedKind",
            (TextEncoderKind,),
            {**_complete(TextEncoderKind), "openai_route": "/v1/probe"},
        )


def test_an_image_kind_is_one_class_over_its_base(tmp_path):
    kind_class = type("ImageProbeKind", (VisionKind,), _complete(VisionKind))
    registry = Registry(lambda cls: cls.task, default="probe-task")
    assert registry.register(kind_class) is kind_class
    kind = kind_class(None, None)
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
    image = tmp_path / "cat.png"
    image.write_bytes(png)
    (request_from_path,), (request_from_bytes,) = kind.requests([image]), kind.requests([png])
    assert request_from_path["IMAGE"].dtype == np.object_
    assert request_from_path["IMAGE"][0, 0] == png == request_from_bytes["IMAGE"][0, 0]
    assert kind.item_size(image) == kind.item_size(png) == len(png)
    assert (kind.modality, kind.item_word) == ("image", "images")

    model_dir, out = tmp_path / "model", tmp_path / "export"
    model_dir.mkdir(), out.mkdir()
    with pytest.raises(ExportError, match="has no preprocessor_config.json"):
        kind.prepare_export(str(model_dir), out, None)
    (model_dir / "preprocessor_config.json").write_text(json.dumps({"size": 224}))
    kind.prepare_export(str(model_dir), out, None)
    files = kind.version_files(str(out / "model.onnx"), str(out))
    assert files == {
        "model.onnx": out / "model.onnx",
        "preprocessor_config.json": out / "preprocessor_config.json",
    }
    assert json.loads(Path(files["preprocessor_config.json"]).read_text()) == {"size": 224}
    assert kind.file_settings({n: n for n in files}) == {
        "onnx": "model.onnx",
        "preprocessor": "preprocessor_config.json",
    }


def test_an_audio_kind_carries_the_clip_and_text_kinds_their_text():
    audio = type("AudioProbeKind", (AudioKind,), _complete(AudioKind))(None, None)
    assert audio.requests([b"RIFF....WAVE"])[0]["AUDIO"][0, 0] == b"RIFF....WAVE"
    text = type(
        "TextProbeKind",
        (TextKind,),
        {**_complete(TextKind), "serving_class": Embedder, "name": "embedding"},
    )(None, None)
    assert text.requests(["héllo"])[0]["TEXT"][0, 0] == "héllo".encode()
