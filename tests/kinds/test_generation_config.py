"""How a translator generates (hf2triton/kinds/generation_config.py), on a tiny M2M100 (random
weights, a sentencepiece tokenizer of 100 languages): the model's generation config read and
checked against what the served decoder implements, the spec's `generation:` section over it,
and the refusals a user meets before any export (a language the tokenizer lacks, none chosen,
more new tokens than the decoder can position)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from hf2triton.errors import SpecError, UnsupportedModelError
from hf2triton.kinds.generation_config import (
    GenerationSpec,
    TranslationConfig,
    decoder_positions,
    eos_and_pad,
    forced_bos,
    resolve_translation_config,
)
from hf2triton.serving.seq2seq import DecodeSettings
from tests.tiny_models import build_tiny_m2m100


@pytest.fixture(scope="module")
def m2m100(tmp_path_factory) -> Path:
    return build_tiny_m2m100(tmp_path_factory.mktemp("generation-config") / "tiny-m2m100")


def test_the_models_generation_config_with_the_spec_over_it(m2m100):
    from transformers import AutoTokenizer

    cfg = resolve_translation_config(m2m100, GenerationSpec(target_lang="sw"))
    sw = AutoTokenizer.from_pretrained(str(m2m100)).get_lang_id("sw")
    s = cfg.settings
    # The model's own: decoder start and end, its pad, max_length 32 (31 new tokens), its
    # no-repeat n-gram size, greedy; the spec's: the target language forced first.
    assert (s.decoder_start_token_id, s.eos_token_ids, s.pad_token_id) == (2, [2], 1)
    assert (s.max_new_tokens, s.no_repeat_ngram_size, s.num_beams) == (31, 3, 1)
    assert s.forced_bos_token_id == sw == cfg.target_langs["sw"]
    assert len(cfg.target_langs) > 90  # every language of M2M100's tokenizer, for requests
    assert cfg.max_input_length == 64  # the tokenizer's model_max_length
    assert cfg.max_new_tokens_limit == 61  # 64 positions, 3 kept free
    assert TranslationConfig(**json.loads(json.dumps(cfg.to_dict()))) == cfg

    spec = GenerationSpec(target_lang="fr", max_new_tokens=5, num_beams=3, max_input_length=16)
    over = resolve_translation_config(m2m100, spec)
    assert (over.settings.max_new_tokens, over.settings.num_beams) == (5, 3)
    assert (
        over.max_input_length == 16 and over.settings.forced_bos_token_id == over.target_langs["fr"]
    )


def test_what_the_spec_must_say_and_may_not(m2m100):
    with pytest.raises(SpecError, match="generation.target_lang is required: tiny-m2m100"):
        resolve_translation_config(m2m100, GenerationSpec())
    with pytest.raises(SpecError, match="'xx' is not a target language of this model's"):
        resolve_translation_config(m2m100, GenerationSpec(target_lang="xx"))
    with pytest.raises(SpecError, match="max_new_tokens 100 is more than .* position \\(61\\)"):
        resolve_translation_config(m2m100, GenerationSpec(target_lang="sw", max_new_tokens=100))
    with pytest.raises(SpecError, match="source_lang 'xx' is not a language"):
        resolve_translation_config(m2m100, GenerationSpec(target_lang="sw", source_lang="xx"))
    with pytest.raises(ValidationError, match="need reference translations"):
        GenerationSpec(thresholds={"min_reference_bleu": 30.0})


def test_a_generation_setting_the_served_decoder_lacks_is_refused(m2m100, tmp_path):
    model = shutil.copytree(m2m100, tmp_path / "suppressing")
    gen = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**gen, "suppress_tokens": [5]}))
    with pytest.raises(UnsupportedModelError, match=r"sets \['suppress_tokens'\]"):
        resolve_translation_config(model, GenerationSpec(target_lang="sw"))


def test_an_encoder_only_model_is_not_a_translator(tiny_bert):
    with pytest.raises(UnsupportedModelError, match="is not an encoder-decoder model"):
        resolve_translation_config(tiny_bert, GenerationSpec())


def test_the_pieces_read_from_a_models_configs():
    config = SimpleNamespace(eos_token_id=2, pad_token_id=None, max_position_embeddings=1026)
    gen = SimpleNamespace(eos_token_id=[7, 8], pad_token_id=None, forced_bos_token_id=None)
    assert eos_and_pad(gen, config) == ([7, 8], 7)  # no pad: the first end of sequence
    assert eos_and_pad(SimpleNamespace(eos_token_id=None, pad_token_id=4), config) == ([2], 4)
    assert decoder_positions(config) == 1023
    assert decoder_positions(SimpleNamespace(max_target_positions=10_000)) == 4096
    assert decoder_positions(SimpleNamespace()) == 1021  # unknown: 1024
    tok = SimpleNamespace()
    assert forced_bos(None, {}, gen, tok, "m") is None  # one target language: nothing forced
    assert forced_bos(None, {}, SimpleNamespace(forced_bos_token_id=9), tok, "m") == 9
    assert forced_bos("de", {"de": 12}, gen, tok, "m") == 12
    with pytest.raises(SpecError, match="use one of \\['de'\\]"):
        forced_bos("fr", {"de": 12}, gen, tok, "m")
    with pytest.raises(SpecError, match="remove the key"):
        forced_bos("fr", {}, gen, tok, "m")


def test_the_config_carries_decode_settings_that_round_trip():
    settings = DecodeSettings(
        decoder_start_token_id=2, eos_token_ids=[2], pad_token_id=1, max_new_tokens=4
    )
    cfg = TranslationConfig(None, None, {}, 8, 10, settings.to_dict())
    assert cfg.settings == settings
