"""`hf2triton schema`: the spec's JSON Schema that editors validate and complete specs with. Every
spec under releases/ passes it, a misspelt key fails it (as it fails the release), and the
committed copy under schema/ is what the models give now."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from hf2triton.errors import SpecError
from hf2triton.spec import TrainingSpec, load_spec, parse_spec
from tests.conftest import ROOT

HF2TRITON = str(Path(sys.executable).parent / "hf2triton")
RELEASES = sorted((ROOT / "releases").glob("*.yaml"))
TRAINING = sorted((ROOT / "releases" / "training").glob("*.yaml"))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HF2TRITON, "schema", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def release_schema() -> jsonschema.Validator:
    proc = _cli()
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)  # the CLI prints one JSON document
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def training_schema() -> jsonschema.Validator:
    proc = _cli("--training")
    assert proc.returncode == 0, proc.stderr
    return jsonschema.Draft202012Validator(json.loads(proc.stdout))


def _problems(validator: jsonschema.Validator, data: dict) -> list[str]:
    """Every message of every error, nested ones (a union's variants) included."""
    found = []
    todo = list(validator.iter_errors(data))
    while todo:
        err = todo.pop()
        found.append(err.message)
        todo += err.context or []
    return found


def test_there_are_specs_to_check():
    assert len(RELEASES) >= 5 and TRAINING


@pytest.mark.parametrize("path", RELEASES, ids=lambda p: p.name)
def test_every_release_spec_validates_and_names_the_schema(path, release_schema):
    assert (
        path.read_text(encoding="utf-8").splitlines()[0]
        == "# yaml-language-server: $schema=../schema/release-spec.json"
    )
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert _problems(release_schema, data) == []
    load_spec(path)  # and the release takes it too


@pytest.mark.parametrize("path", TRAINING, ids=lambda p: p.name)
def test_every_training_spec_validates_and_names_the_schema(path, training_schema):
    assert (
        path.read_text(encoding="utf-8").splitlines()[0]
        == "# yaml-language-server: $schema=../../schema/training-spec.json"
    )
    assert _problems(training_schema, yaml.safe_load(path.read_text(encoding="utf-8"))) == []
    load_spec(path, model=TrainingSpec)


def _default_spec() -> dict:
    return yaml.safe_load((ROOT / "releases" / "minilm-embedder.yaml").read_text())


def _rename(data: dict, dotted: str, new: str) -> dict:
    data = copy.deepcopy(data)
    *parents, key = dotted.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[new] = node.pop(key)
    return data


@pytest.mark.parametrize(
    "dotted, misspelt",
    [
        ("validation", "valdation"),
        ("deploy.max_batch_size", "max_batch_sise"),
        ("embedding.pooling", "poolng"),
        ("source.package", "pakage"),
        ("registry.model_name", "modelname"),
    ],
)
def test_a_misspelt_key_is_rejected_by_the_schema_as_by_the_release(
    dotted, misspelt, release_schema
):
    data = _rename(_default_spec(), dotted, misspelt)
    problems = _problems(release_schema, data)
    assert any(repr(misspelt) in p and "unexpected" in p for p in problems), problems
    with pytest.raises(SpecError, match=misspelt):
        parse_spec(data, base_dir=ROOT / "releases")


def test_a_deploy_section_without_target_means_local_triton(release_schema):
    data = _default_spec()
    data["deploy"] = {"max_batch_size": 8, "preferred_batch_sizes": [4, 8]}
    assert _problems(release_schema, data) == []
    assert parse_spec(data, base_dir=ROOT / "releases").deploy.target == "local-triton"


def test_a_key_of_another_target_and_a_value_out_of_range_are_rejected(release_schema):
    data = _default_spec()
    data["deploy"]["replicas"] = [{"http": "10.0.0.1:8000", "grpc": "10.0.0.1:8001"}]
    assert any("'replicas'" in p for p in _problems(release_schema, data))
    data = _default_spec()
    data["validation"]["smoke_sentences"] = 0
    assert any("0 is less than the minimum of 1" in p for p in _problems(release_schema, data))
    data = _default_spec()
    data["deploy"]["target"] = "kubernetes"
    assert _problems(release_schema, data)


def test_the_committed_schemas_are_what_the_models_give():
    for args in ((), ("--training",)):
        proc = _cli("--check", *args)
        assert proc.returncode == 0, proc.stderr


def test_a_stale_schema_file_is_named_with_the_command_that_renews_it(tmp_path):
    stale = tmp_path / "release-spec.json"
    stale.write_text(
        (ROOT / "schema" / "release-spec.json")
        .read_text()
        .replace('"additionalProperties": false', '"additionalProperties": true', 1)
    )
    proc = _cli("--check", str(stale))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"hf2triton: error: {stale} is out of date with the spec models: run "
        f"`hf2triton schema --output {stale}`"
    ]
    out = tmp_path / "fresh.json"
    assert _cli("--output", str(out)).returncode == 0
    assert _cli("--check", str(out)).returncode == 0


def test_a_schema_that_cannot_be_written_is_one_error_line(tmp_path):
    proc = _cli("--output", str(tmp_path / "no-such-folder" / "release-spec.json"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"hf2triton: error: cannot write {tmp_path / 'no-such-folder' / 'release-spec.json'}: "
        "No such file or directory"
    ]
