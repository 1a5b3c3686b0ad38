"""The served translator's tokenizer (hf2triton/kinds/serving_tokenizer.py): the files it reads
written from a model's own tokenizer (M2M100's and Marian's sentencepiece models, or a fast
tokenizer.json), and the check that refuses a tokenizer that would not encode or decode as
transformers does."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf2triton.errors import UnsupportedModelError
from hf2triton.kinds.generation_config import load_tokenizer
from hf2triton.kinds.serving_tokenizer import check_tokenizer, write_serving_tokenizer
from hf2triton.serving.seq2seq import Seq2SeqTokenizer
from tests.tiny_models import SEQ2SEQ_CORPUS, build_tiny_m2m100, build_tiny_marian

TEXTS = list(dict.fromkeys(SEQ2SEQ_CORPUS))[:6] + ["ÄÖÜ ß straße", "word " * 90]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serving-tokenizer")
    return {
        "m2m100": build_tiny_m2m100(root / "tiny-m2m100"),
        "marian": build_tiny_marian(root / "tiny-marian"),
    }


@pytest.mark.parametrize("style", ["m2m100", "marian"])
def test_a_sentencepiece_tokenizer_is_served_as_transformers_runs_it(models, style, tmp_path):
    source = "en" if style == "m2m100" else None
    plan = write_serving_tokenizer(models[style], tmp_path, source)
    assert (plan["kind"], plan["style"]) == ("sentencepiece", style)
    for key in ("spm_source", "spm_target", "vocab", "tokens"):
        assert (tmp_path / plan[key]).is_file()
    tok = load_tokenizer(models[style], source)
    assert plan["unk_id"] == tok.unk_token_id and plan["skip_ids"] == list(tok.all_special_ids)
    served = Seq2SeqTokenizer(str(tmp_path), plan, 64)
    generated = [tok(t)["input_ids"][1:6] for t in TEXTS]  # ids as a decoder might emit them
    check_tokenizer(served, tok, TEXTS, generated)  # encodes and decodes as transformers does
    ids, truncated = served.encode(TEXTS)
    assert ids == tok(TEXTS, truncation=True, max_length=64)["input_ids"]
    assert truncated[-1] and not truncated[0]


def test_a_fast_tokenizer_is_served_from_its_tokenizer_json(tiny_bert, tmp_path):
    plan = write_serving_tokenizer(tiny_bert, tmp_path, None)
    assert plan == {
        "kind": "tokenizers",
        "file": "tokenizer.json",
        "clean_up_tokenization_spaces": plan["clean_up_tokenization_spaces"],
    }
    assert (tmp_path / "tokenizer.json").is_file()


class _OffByOne:
    """A served tokenizer that gets every id wrong by one, or decodes to other text."""

    max_length = 64

    def __init__(self, tok, encodes: bool):
        self.tok, self.encodes = tok, encodes

    def encode(self, texts):
        ids = self.tok(texts, truncation=True, max_length=64)["input_ids"]
        return (ids if self.encodes else [[i + 1 for i in row] for row in ids]), []

    def decode(self, sequences):
        return ["something else" for _ in sequences]


def test_a_tokenizer_that_differs_from_transformers_is_refused(models):
    tok = load_tokenizer(models["marian"])
    with pytest.raises(UnsupportedModelError, match="encodes 'the quick brown fox"):
        check_tokenizer(_OffByOne(tok, encodes=False), tok, TEXTS[:1], [[5, 6]])
    with pytest.raises(UnsupportedModelError, match=r"decodes \[5, 6\]"):
        check_tokenizer(_OffByOne(tok, encodes=True), tok, TEXTS[:1], [[5, 6]])


def test_a_source_language_the_tokenizer_lacks_is_a_spec_error(models, tmp_path):
    from hf2triton.errors import SpecError

    with pytest.raises(SpecError, match="has no source language to set"):
        write_serving_tokenizer(models["marian"], tmp_path, "en")
