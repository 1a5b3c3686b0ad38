"""The embedding kind's configuration (hf2triton/kinds/embedding.py): pooling, normalisation and
maximum length read from the model's own sentence-transformers files, and the spec's settings
over them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf2triton.kinds.embedding import EmbeddingConfig, resolve_embedding_config
from hf2triton.spec import load_spec


def _st_dir(tmp_path: Path, cls: bool, normalize: bool, max_seq: int | None) -> Path:
    d = tmp_path / "st"
    (d / "1_Pooling").mkdir(parents=True)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (d / "modules.json").write_text(json.dumps(modules))
    (d / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": cls, "pooling_mode_mean_tokens": not cls})
    )
    if max_seq is not None:
        (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq}))
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 384}))
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    return d


def test_minilm_embedding_config_is_the_models_own(minilm_dir):
    assert resolve_embedding_config(minilm_dir) == EmbeddingConfig(
        pooling="mean", normalize=True, max_length=256
    )


def test_tiny_bert_without_sentence_transformers_files(tiny_bert):
    # No modules.json: mean pooling, no normalisation, the smaller of tokenizer/model limits.
    assert resolve_embedding_config(tiny_bert) == EmbeddingConfig("mean", False, 64)


@pytest.mark.parametrize(
    "cls, normalize, max_seq, expected",
    [
        (True, False, 128, EmbeddingConfig("cls", False, 128)),
        (False, True, None, EmbeddingConfig("mean", True, 384)),
        (True, True, 200, EmbeddingConfig("cls", True, 200)),
    ],
)
def test_sentence_transformers_files_decide_auto(tmp_path, cls, normalize, max_seq, expected):
    assert resolve_embedding_config(_st_dir(tmp_path, cls, normalize, max_seq)) == expected


def test_explicit_settings_override_the_model(minilm_dir):
    assert resolve_embedding_config(
        minilm_dir, pooling="cls", normalize=False, max_length=128
    ) == EmbeddingConfig("cls", False, 128)


def test_the_seed_embedding_specs_are_valid():
    releases = Path(__file__).resolve().parents[2] / "releases"
    for name in ("multilingual-e5-large.yaml", "biolinkbert-large.yaml"):
        spec = load_spec(releases / name)
        assert spec.source.repo_id and spec.source.revision
        assert spec.task == "feature-extraction"
    assert load_spec(releases / "biolinkbert-large.yaml").embedding.pooling == "mean"


def test_pytorchs_reference_batches_shortest_first_and_answers_in_the_rows_order(tiny_bert):
    """The reference pads each batch to its longest row only: rows are batched shortest first,
    and each answer is still its own row's (what one row alone gives), in the rows' order."""
    import numpy as np

    from hf2triton.kinds.embedding import TorchEmbedder
    from tests.tiny_bert_steps import SENTENCES

    texts = [t for t in SENTENCES if t.strip()]
    texts = [texts[i] for i in np.random.default_rng(3).permutation(len(texts))]
    ref = TorchEmbedder(tiny_bert, resolve_embedding_config(tiny_bert))
    order = ref.length_order(texts)
    lengths = [len(ref.tokenizer(texts[i])["input_ids"]) for i in order]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    assert list(order) != list(range(len(texts)))  # the shuffled rows are not already in order
    together = ref.embed(texts, batch_size=4)
    alone = np.concatenate([ref.embed([t]) for t in texts])
    assert together.shape == alone.shape
    assert np.abs(together - alone).max() < 1e-5
