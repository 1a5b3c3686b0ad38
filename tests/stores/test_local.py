"""Model store `local`: a version is written into the served folder only when every file matches
the sha256 recorded for the release, replacing what was there whole; an S3 repository is refused
with the fix."""

from __future__ import annotations

import pytest

from hf2triton.errors import ArtifactError, ModelStoreError
from hf2triton.stores import default_store, parse_store
from hf2triton.stores.local import LocalStore
from hf2triton.util.workspace import hash_files


def _model(root, weights: bytes = b"graph"):
    """A built repository's model folder: version 1, warmup/ and config.pbtxt."""
    model = root / "tiny"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(weights)
    (model / "warmup").mkdir()
    (model / "warmup" / "input").write_bytes(b"w")
    (model / "config.pbtxt").write_text('name: "tiny"\n')
    expected = {f"1/{k}": v for k, v in hash_files(model / "1").items()}
    return root, expected


def test_the_local_store_is_the_default_and_survives_its_description():
    store = default_store()
    assert isinstance(store, LocalStore) and store.triton_uri() is None
    assert parse_store(store.describe()) == store


def test_a_version_is_put_checked_and_listed(tmp_path):
    src, expected = _model(tmp_path / "built")
    served = tmp_path / "served"
    store = LocalStore()
    store.put_version(str(src), "tiny", "7", expected, repository=str(served))
    model_dir = store.model_dir("tiny", str(served))
    assert model_dir.versions() == ["7"]
    assert model_dir.version_files("7") == expected
    assert (served / "tiny" / "7" / "model.onnx").read_bytes() == b"graph"
    assert model_dir.read_config() == 'name: "tiny"\n'
    assert model_dir.version_files("8") is None
    model_dir.write_config('name: "tiny"\nmax_batch_size: 8\n')
    assert "max_batch_size: 8" in (served / "tiny" / "config.pbtxt").read_text()
    store.put_version(str(src), "tiny", "10", expected, repository=str(served))
    assert model_dir.versions() == ["7", "10"]  # in number order
    model_dir.remove_version("7")
    assert model_dir.versions() == ["10"]


def test_files_that_do_not_match_the_release_are_refused_and_nothing_changes(tmp_path):
    src, expected = _model(tmp_path / "built")
    served = tmp_path / "served"
    store = LocalStore()
    store.put_version(str(src), "tiny", "1", expected, repository=str(served))
    (src / "tiny" / "1" / "model.onnx").write_bytes(b"another graph")
    with pytest.raises(ArtifactError, match=r"model files \['1/model.onnx'\] do not match"):
        store.put_version(str(src), "tiny", "1", expected, repository=str(served))
    assert (served / "tiny" / "1" / "model.onnx").read_bytes() == b"graph"  # as it was
    assert [p.name for p in (served / "tiny").iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("repository", [None, "s3://bucket/models"])
def test_a_repository_not_on_this_machine_is_refused_with_the_fix(repository):
    with pytest.raises(ModelStoreError, match="set deploy.model_store kind s3"):
        LocalStore().model_dir("tiny", repository)
