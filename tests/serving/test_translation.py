"""hf2triton/serving/translation.py: the served translator. Each text comes back translated with
the request's own settings (max new tokens, beams, target language), texts with the same
settings generated together; a bad setting is refused naming the input and its bounds while
the other requests are answered. A hand-written export that copies its source
(tests/serving/graphs.py) makes each right answer known."""

from __future__ import annotations

import numpy as np
import pytest

from hf2triton.serving.decoding import DecodeSettings
from hf2triton.serving.translation import Translator
from tests.serving.graphs import copy_translator, tokenizer_file


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    directory = tmp_path_factory.mktemp("translation")
    files = copy_translator(directory)
    tokenizer_file(directory / "tokenizer.json")
    settings = {
        "tokenizer": {"kind": "tokenizers", "file": "tokenizer.json"},
        "max_input_length": 6,
        "files": files,
        "decode": DecodeSettings(1, [0], 0, max_new_tokens=8).to_dict(),
        "target_langs": {"sw": 30, "fr": 31},
        "max_new_tokens_limit": 20,
        "max_beams": 4,
        "max_batch_tokens": 4,
        "intra_op_threads": 1,
    }
    return Translator.from_directory(str(directory), settings)


def request(*texts: str, **per_text) -> dict[str, np.ndarray]:
    arrays = {"TEXT": np.array([[t.encode()] for t in texts], np.object_)}
    for name, values in per_text.items():
        if name == "TARGET_LANG":
            arrays[name] = np.array([[v.encode()] for v in values], np.object_)
        else:
            arrays[name] = np.array([[v] for v in values], np.int32)
    return arrays


def translations(answer) -> list[str]:
    return [row[0].decode() for row in answer["TRANSLATION"]]


def test_each_text_is_translated_with_its_own_settings_in_order(translator):
    plain, own = translator.answer(
        [
            request("w5 w6 w7", "w9"),
            request(
                "w5 w6 w7",
                "w8 w9",
                "w2 w3 w4",
                MAX_NEW_TOKENS=[1, 8, 8],
                NUM_BEAMS=[1, 1, 3],
                TARGET_LANG=["fr", "sw", "fr"],
            ),
        ]
    )
    assert translations(plain) == ["w5 w6 w7", "w9"]
    assert translations(own) == ["w31", "w30 w9", "w31 w3 w4"]  # the language's token first
    assert plain["TRUNCATED"].tolist() == [[False], [False]]


def test_texts_over_the_input_length_are_cut_and_say_so(translator):
    (answer,) = translator.answer([request("w2 w3 w4 w5 w6 w7 w8 w9")])
    assert translations(answer) == ["w2 w3 w4 w5 w6 w7"] and answer["TRUNCATED"].tolist() == [
        [True]
    ]


@pytest.mark.parametrize(
    "arrays, message",
    [
        (request("w5", MAX_NEW_TOKENS=[21]), "MAX_NEW_TOKENS 21 is outside 1..20"),
        (request("w5", NUM_BEAMS=[0]), "NUM_BEAMS 0 is outside 1..4"),
        (
            request("w5", TARGET_LANG=["de"]),
            "TARGET_LANG 'de' is not one of this model's target languages (fr, sw)",
        ),
        (
            request("w5", "w6", NUM_BEAMS=[2]),
            "NUM_BEAMS needs one value per text: shape [2, 1], got [1, 1]",
        ),
        (
            {
                "TEXT": np.array([[b"w5"]], np.object_),
                "TARGET_LANG": np.array([[b"fr", b"sw"]], np.object_),
            },
            "TARGET_LANG needs one value per text",
        ),
    ],
)
def test_a_bad_setting_is_refused_naming_it_and_the_others_answered(translator, arrays, message):
    bad, good = translator.answer([arrays, request("w7")])
    assert isinstance(bad, str) and bad.startswith(message)
    assert translations(good) == ["w7"]


def test_the_gates_in_process_path_translates_a_batch(translator):
    assert translator.translate(["w4 w5", "w6"], num_beams=2) == ["w4 w5", "w6"]
