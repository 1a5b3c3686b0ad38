"""hf2triton/serving/seq2seq.py: an encoder-decoder export run as transformers' `generate` runs it,
and its tokenizer. A hand-written export that copies its source (tests/serving/graphs.py) makes
the right output known: each row, padded or not, greedy or beam, gets its own source back."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hf2triton.serving.decoding import DecodeSettings
from hf2triton.serving.seq2seq import (
    Seq2SeqModel,
    Seq2SeqTokenizer,
    clean_up_tail,
    clean_up_tokenization,
    load_serving,
)
from tests.serving.graphs import copy_translator, tokenizer_file

START = 1
SETTINGS = DecodeSettings(
    decoder_start_token_id=START, eos_token_ids=[0], pad_token_id=0, max_new_tokens=8
)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    directory = tmp_path_factory.mktemp("seq2seq")
    files = copy_translator(directory)
    tokenizer_file(directory / "tokenizer.json")
    return directory, files


@pytest.fixture(scope="module")
def model(export):
    directory, files = export
    return Seq2SeqModel({role: str(directory / name) for role, name in files.items()}, threads=1)


SOURCES = [[5, 6, 7], [9, 3], [12], [4, 4, 4, 4, 4, 4]]


@pytest.mark.parametrize("num_beams", [1, 3])
def test_each_row_gets_its_own_answer_padded_to_the_longest(model, num_beams):
    out = model.generate(SOURCES, replace(SETTINGS, num_beams=num_beams), pad_id=0)
    width = max(len(s) for s in SOURCES) + 2  # the start token and the end
    assert out == [[START, *s, 0] + [0] * (width - len(s) - 2) for s in SOURCES]


def test_max_new_tokens_ends_the_answer(model):
    assert model.generate([[5, 6, 7, 8]], replace(SETTINGS, max_new_tokens=2), pad_id=0) == [
        [START, 5, 6]
    ]
    forced = replace(SETTINGS, forced_bos_token_id=30)  # a target language's token first
    assert model.generate([[5, 6, 7]], forced, pad_id=0) == [[START, 30, 6, 7, 0]]


def test_a_fast_tokenizer_encodes_cuts_at_max_length_and_decodes_without_specials(export):
    directory, _ = export
    tok = Seq2SeqTokenizer(
        str(directory), {"kind": "tokenizers", "file": "tokenizer.json"}, max_length=3
    )
    ids, cut = tok.encode(["w5 w6", "w2 w3 w4 w5 w6", "what"])
    assert ids == [[5, 6], [2, 3, 4], [1]] and cut == [False, True, False]
    assert tok.decode([[START, 5, 6, 0, 0]]) == ["w5 w6"]  # special tokens skipped
    with pytest.raises(ValueError, match="unknown tokenizer kind 'bpe'"):
        Seq2SeqTokenizer(str(directory), {"kind": "bpe"}, max_length=3)


def test_clean_up_is_transformers_and_a_stream_holds_back_what_it_may_rewrite():
    assert (
        clean_up_tokenization("I do n't know , he said . It 's fine !")
        == "I don't know, he said. It's fine!"
    )
    assert clean_up_tail("it") == 0
    assert clean_up_tail("it '") == 2  # " 's" or " 've" may still come
    assert clean_up_tail("so n") == 2  # " n't"
    assert clean_up_tail("done ") == 1


def test_a_served_directory_loads_its_tokenizer_model_and_default_settings(export):
    directory, files = export
    cfg = {
        "tokenizer": {
            "kind": "tokenizers",
            "file": "tokenizer.json",
            "clean_up_tokenization_spaces": True,
        },
        "max_input_length": 16,
        "files": files,
        "decode": SETTINGS.to_dict(),
        "runtime": {"name": "openvino", "precision": "fp32"},
    }
    tokenizer, model, defaults = load_serving(str(directory), cfg)
    assert defaults == SETTINGS and tokenizer.clean_up
    assert {s.in_use for s in model.sessions.values()} == {"OpenVINO CPU f32"}
    ids, _ = tokenizer.encode(["w7 w8"])
    assert tokenizer.decode(model.generate(ids, defaults, pad_id=0)) == ["w7 w8"]
