"""The serving core (hf2triton/serving) on its own: token-aware sub-batches keep every row's answer
and the request order, whatever the budget, for every kind that batches text."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hf2triton.serving.text import plan_sub_batches
from tests.tiny_models import CORPUS

TEXTS = list(dict.fromkeys(CORPUS)) + ["a", "", "word " * 100, "ok thanks", "prices 12.5%"]


@pytest.mark.parametrize("seed", range(5))
def test_sub_batches_cover_every_row_once_within_the_budget(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([2, 3, 5, 12, 30, 64, 256]) for _ in range(rng.randint(1, 80))]
    budget = rng.choice([64, 256, 1024])
    groups = plan_sub_batches(lengths, budget)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        padded = len(g) * max(lengths[i] for i in g)
        assert padded <= budget or len(g) == 1  # a row longer than the budget runs alone
    longest = [max(lengths[i] for i in g) for g in groups]
    assert longest == sorted(longest)  # short rows together, long rows together


def test_without_a_budget_the_batch_runs_as_one_in_arrival_order():
    assert plan_sub_batches([5, 1, 9], 0) == [[0, 1, 2]]
    assert plan_sub_batches([], 0) == [] and plan_sub_batches([], 128) == []


@pytest.fixture(scope="module")
def exported(tiny_bert, tmp_path_factory):
    from hf2triton.kinds import Data
    from hf2triton.kinds.embedding import resolve_embedding_config
    from hf2triton.release.export import export_model
    from hf2triton.spec import ExportSpec
    from tests.tiny_bert_steps import embedding_kind

    return export_model(
        embedding_kind(tiny_bert),
        {"model_dir": str(tiny_bert), "content_hash": "tiny"},
        ExportSpec(opset=18, atol=1e-3),
        resolve_embedding_config(tiny_bert),
        Data(TEXTS),
        str(tmp_path_factory.mktemp("work")),
    )


@pytest.mark.parametrize("budget", [16, 100, 1000])
def test_embeddings_do_not_depend_on_the_budget_and_keep_request_order(exported, tiny_bert, budget):
    from hf2triton.kinds.embedding import cosine_rows, resolve_embedding_config
    from hf2triton.serving.embedding import Embedder

    cfg = resolve_embedding_config(tiny_bert).to_dict()
    tok = f"{exported['export_dir']}/tokenizer.json"
    padded = Embedder(exported["onnx_path"], tok, {**cfg, "max_batch_tokens": 0})
    bounded = Embedder(exported["onnx_path"], tok, {**cfg, "max_batch_tokens": budget})
    shuffled = TEXTS[::-1]
    want = padded.embed(shuffled)
    got = bounded.embed(shuffled)
    assert got.shape == want.shape
    assert cosine_rows(got, want).min() > 0.99999
    # Each request gets its own rows back, in the order it sent them.
    requests = [
        {"TEXT": np.array([[t.encode()] for t in shuffled[i : i + 3]], dtype=np.object_)}
        for i in range(0, len(shuffled), 3)
    ]
    answers = bounded.answer(requests)
    joined = np.concatenate([a["EMBEDDING"] for a in answers])
    assert cosine_rows(joined, want).min() > 0.99999
    truncated = np.concatenate([a["TRUNCATED"] for a in answers])[:, 0]
    assert truncated.tolist() == [len(t.split()) > 60 for t in shuffled]
    # TOKENS: what each text was embedded from, special tokens and truncation included (an
    # API's usage figure).
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tok)
    tokens = np.concatenate([a["TOKENS"] for a in answers])[:, 0]
    assert tokens.tolist() == [
        min(len(e.ids), cfg["max_length"]) for e in tokenizer.encode_batch(shuffled)
    ]
    assert tokens.max() == cfg["max_length"] and tokens.min() < 10


def test_a_bad_request_is_answered_alone(exported, tiny_bert):
    from hf2triton.kinds.embedding import resolve_embedding_config
    from hf2triton.serving.embedding import Embedder

    model = Embedder(
        exported["onnx_path"],
        f"{exported['export_dir']}/tokenizer.json",
        {**resolve_embedding_config(tiny_bert).to_dict(), "max_batch_tokens": 64},
    )
    good = {"TEXT": np.array([[b"hello"]], dtype=np.object_)}
    answers = model.answer(
        [
            good,
            {"TEXT": np.array([[b"\xff"]], dtype=np.object_)},
            {"TEXT": np.array([[b"a", b"b"]], dtype=np.object_)},
            good,
        ]
    )
    assert answers[1].startswith("TEXT[0] is not valid UTF-8")
    assert "shape [batch, 1]" in answers[2]
    assert np.allclose(answers[0]["EMBEDDING"], answers[3]["EMBEDDING"])
