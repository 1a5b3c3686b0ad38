"""The embedded default language model's trainer (hf2triton.training.lm, a spec's
`source.train`): it trains a Llama-architecture model and its BPE tokenizer on the shipped
public-domain text, the same text and settings give the same files byte for byte, a second run
reuses them, and PyTorch generates text from a prompt with them. CI trains with few steps and a
tiny shape (the release's own settings take about 3 minutes: see docs/embedded-llm.md)."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from hf2triton.errors import SpecError
from hf2triton.sources.train import TrainSource, TrainSourceSpec
from hf2triton.spec import parse_spec
from hf2triton.training.lm import generate, train_lm
from hf2triton.util.workspace import hash_files
from tests.conftest import ROOT

TEXT = ROOT / "releases" / "data" / "kjv-pentateuch.txt"
SPEC = ROOT / "releases" / "kjv-lm.yaml"
TINY = {
    "text": str(TEXT),
    "vocab_size": 512,
    "layers": 1,
    "hidden": 64,
    "heads": 2,
    "context": 32,
    "max_positions": 128,
    "steps": 40,
    "batch_size": 8,
    "learning_rate": 0.01,
    "seed": 3,
}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("lm-home")


@pytest.fixture(scope="module")
def trained(home):
    spec = TrainSourceSpec(**TINY)
    return spec, train_lm(spec, home / "sources" / "trained")


def test_it_trains_a_llama_with_its_tokenizer_and_chat_template(trained):
    from transformers import AutoConfig, AutoTokenizer

    spec, result = trained
    assert not result["reused"] and result["tokens"] > 100_000
    config = AutoConfig.from_pretrained(result["model_dir"])
    assert config.model_type == "llama" and config.num_hidden_layers == 1
    assert config.hidden_size == 64 and config.max_position_embeddings == 128
    # It learnt something: well below the loss of a uniform guess over the vocabulary.
    assert result["losses"][-1] < min(result["losses"][0], math.log(512) - 0.75)
    tokenizer = AutoTokenizer.from_pretrained(result["model_dir"])
    assert len(tokenizer) == config.vocab_size == 512
    assert tokenizer.tokenize("And the LORD said")[0] == "And"  # BPE merges from the text
    saved = json.loads((ROOT / result["model_dir"] / "tokenizer_config.json").read_text())
    assert saved["chat_template"] == spec.chat_template
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "And Moses said "}], tokenize=False
    )
    assert chat == "And Moses said\n"


def test_pytorch_generates_text_from_a_prompt(trained):
    _, result = trained
    text = generate(result["model_dir"], "And the LORD said unto Moses,", 24)
    words = text.split()
    assert len(words) >= 3, text
    # Byte-level BPE learnt on the text: what it writes is made of the text's own characters.
    alphabet = set(TEXT.read_text(encoding="utf-8"))
    assert set(text) <= alphabet, text


def test_the_same_text_and_settings_give_the_same_files(trained, tmp_path):
    spec, first = trained
    again = train_lm(spec, tmp_path)
    assert not again["reused"] and again["losses"] == first["losses"]
    assert hash_files(again["model_dir"]) == hash_files(first["model_dir"])
    other = train_lm(spec.model_copy(update={"seed": spec.seed + 1, "steps": 2}), tmp_path)
    assert hash_files(other["model_dir"]) != hash_files(again["model_dir"])


def test_a_second_run_reuses_the_model_and_the_source_fetches_it(trained, home, monkeypatch):
    from hf2triton.sources import fetch_model

    spec, first = trained
    again = train_lm(spec, home / "sources" / "trained")
    assert again["reused"] and again["model_dir"] == first["model_dir"]
    monkeypatch.setenv("HF2TRITON_HOME", str(home))
    found = fetch_model(TrainSource(train=spec))
    assert found["model_dir"] == first["model_dir"]
    assert found["source_id"] == "trained:kjv-pentateuch.txt" and found["revision"] is None
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(found["files"])


@pytest.mark.parametrize(
    "train, problem",
    [
        ({"hidden": 100, "heads": 3}, "hidden 100 is not a multiple of heads 3"),
        ({"context": 512, "max_positions": 256}, "context 512 is more than max_positions 256"),
        ({"text": "data/no-such.txt"}, "no-such.txt"),
    ],
)
def test_bad_training_settings_are_refused_by_name(train, problem):
    spec = yaml.safe_load((ROOT / "releases" / "minilm-embedder.yaml").read_text())
    spec["source"] = {"train": {"text": "data/kjv-pentateuch.txt", **train}}
    with pytest.raises(SpecError, match=problem):
        parse_spec(spec, ROOT / "releases")


def test_the_shipped_text_names_its_source_and_licence_and_is_small():
    head = TEXT.read_text(encoding="utf-8").split("\n", 12)[:10]
    assert all(line.startswith("# ") for line in head)
    assert "bible-kjv-text" in " ".join(head) and "public domain" in " ".join(head)
    assert TEXT.stat().st_size <= 1_000_000


def test_the_release_spec_trains_from_the_shipped_text():
    source = yaml.safe_load(SPEC.read_text())["source"]
    from pydantic import TypeAdapter

    from hf2triton.sources import SourceSpec

    spec = TypeAdapter(SourceSpec).validate_python(source, context={"base_dir": ROOT / "releases"})
    assert isinstance(spec, TrainSource) and spec.train.text == str(TEXT)


def test_the_embedded_llm_release_spec_validates():
    spec = parse_spec(yaml.safe_load(SPEC.read_text()), ROOT / "releases")
    assert spec.task == "text-generation" and isinstance(spec.source, TrainSource)
