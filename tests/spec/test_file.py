"""Reading a spec file: YAML into a spec model, every problem one SpecError line that names the
file, the key and the value (a union section's variant too), and never a URI's password."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import Field

from hf2triton.errors import SpecError
from hf2triton.spec import ReleaseSpec
from hf2triton.spec.file import load_spec, parse_spec
from hf2triton.util.specbase import Name, SpecPath, Strict
from tests.conftest import ROOT


class Inner(Strict):
    batch: int = Field(8, ge=1)


class Small(Strict):
    name: Name
    data: SpecPath
    tracking_uri: str | None = Field(None, pattern=r"^(http|https|file)://")
    inner: Inner = Inner()


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_spec_file_loads_with_paths_relative_to_it(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "s.yaml"
    path.write_text("name: tiny\ndata: ../d.txt\ninner: {batch: 4}\n", encoding="utf-8")
    spec = load_spec(path, Small)
    assert (spec.name, spec.data, spec.inner.batch) == ("tiny", str(tmp_path / "d.txt"), 4)


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("name: tiny\ndata: d\ncolour: blue\n", ["unknown key 'colour'"]),
        ("name: tiny\ndata: d\ninner: {batches: 2}\n", ["unknown key 'inner.batches'"]),
        ("data: d\n", ["missing key 'name'"]),
        ("name: Tiny\ndata: d\n", ["'name' = 'Tiny'", "is not a valid name"]),
        ("name: tiny\ndata: d\ninner: {batch: 0}\n", ["'inner.batch' = 0", "greater than"]),
        ("name: tiny\ndata: d\ninner: [4]\n", ["'inner' = [4]: a section is a mapping of keys"]),
        ("name: tiny\ndata: 3\n", ["'data' = 3: text is wanted here: put it in quotes"]),
        ("name: tiny\ndata: d\ninner: yes\n", ["'inner' = True: a section is a mapping"]),
        (
            "name: Bad Name\ndata: d\ninner: {batch: -1}\n",
            ["'name' = 'Bad Name'", "'inner.batch' = -1"],
        ),  # every problem at once
    ],
)
def test_a_bad_value_names_the_file_key_and_value(tmp_path, text, fragments):
    path = _file(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path, Small)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and msg.endswith("Fix the spec and run again.")
    for fragment in fragments:
        assert fragment in msg
    assert info.value.code == "INVALID_SPEC" and info.value.exit_code == 2


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("name: [unclosed\n", "is not valid YAML"),
        ("", "got an empty document"),
        ("- a\n- b\n", "a spec is a YAML mapping of keys, got a list"),
        ("just text\n", "got a str"),
    ],
)
def test_a_file_that_is_no_spec_says_so(tmp_path, text, fragment):
    with pytest.raises(SpecError, match=fragment):
        load_spec(_file(tmp_path, text), Small)


def test_a_missing_or_unreadable_file_is_named(tmp_path):
    with pytest.raises(SpecError, match=r"spec file '.*nowhere.yaml' does not exist"):
        load_spec(tmp_path / "nowhere.yaml", Small)
    with pytest.raises(SpecError, match="cannot be read"):
        load_spec(tmp_path, Small)  # a folder
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(SpecError, match="cannot be read"):
        load_spec(latin, Small)


def test_a_uris_password_never_reaches_the_error(tmp_path):
    path = _file(tmp_path, "name: tiny\ndata: d\ntracking_uri: ftp://admin:hunter2@mlflow:5000\n")
    with pytest.raises(SpecError) as info:
        load_spec(path, Small)
    assert "'tracking_uri' = " in str(info.value) and "mlflow:5000" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    path = _file(tmp_path, "name: tiny\ndata: d\ninner:\n  batch: 2\n  batch: 4\n")
    with pytest.raises(SpecError, match=r"line 5.*key 'batch' is given twice \(lines 4 and 5\)"):
        load_spec(path, Small)
    # Merge keys override what they paste, however they chain: that is no key given twice.
    merged = _file(
        tmp_path,
        "x-base: &a {batch: 1}\nx-mid: {m: &b {<<: *a, batch: 2}}\n"
        "name: tiny\ndata: d\ninner: {<<: *b}\n",
    )
    with pytest.raises(SpecError, match="unknown key 'x-base'"):  # parsed: only Small refuses it
        load_spec(merged, Small)


def test_a_yaml_error_names_line_and_column_but_never_quotes_the_text(tmp_path):
    """YAML's own message quotes the spec's line, which can hold a secret: the error names
    where and what instead, on one line."""
    path = _file(tmp_path, 'name: tiny\ndata: d\ntracking_uri: "http://bob:hunter2@h:5000\n')
    with pytest.raises(SpecError) as info:
        load_spec(path, Small)
    msg = str(info.value)
    assert "is not valid YAML at line" in msg and "quoted scalar at line 3" in msg, msg
    assert "hunter2" not in msg and "\n" not in msg


@pytest.mark.parametrize(
    "spec",
    [
        # Python cannot parse the netloc: no traceback, and the password still goes.
        {
            "deploy": {
                "target": "local-triton",
                "model_store": {
                    "kind": "s3",
                    "bucket": "models",
                    "endpoint": "http://AKIA:hunter2@minio:9000 [",
                },
            }
        },
        {
            "deploy": {
                "target": "local-triton",
                "model_store": {
                    "kind": "s3",
                    "bucket": "models",
                    "endpoint": "http://AKIA:hunter2@minio:9000",
                },
            }
        },
        {
            "source": {
                "mlflow": {
                    "model": "m",
                    "alias": "a",
                    "tracking_uri": "http://u:hunter2@mlflow:5000",
                }
            }
        },
        # A quote is valid in a URI's password: Python's parser still finds the login.
        {
            "source": {
                "mlflow": {"model": "m", "alias": "a", "tracking_uri": "http://u:hunter2'x@h:5"}
            }
        },
        {
            "deploy": {
                "target": "local-triton",
                "model_store": {"kind": "s3", "bucket": "b1", "endpoint": "http://A:hunter2'x@m"},
            }
        },
        # A rule over a section: its keys are named, its values (a password here) are not.
        {
            "deploy": {
                "target": "kserve",
                "kubernetes": {
                    "storage_uri": "s3://models/x",
                    "endpoint_openai": "http://u:hunter2@h:9/v1",
                    "min_replicas": 5,
                    "max_replicas": 2,
                },
            }
        },
    ],
)
def test_credentials_in_a_uri_are_refused_and_never_echoed(spec):
    data = _release()
    data.update({k: {**data.get(k, {}), **v} for k, v in spec.items()})
    if "source" in spec:
        data["source"] = spec["source"]
    with pytest.raises(SpecError) as info:
        parse_spec(data, ReleaseSpec)
    msg = str(info.value)
    assert "hunter2" not in msg, msg
    if "kubernetes" in str(spec):
        assert (
            "'deploy.kubernetes' (keys given: storage_uri, endpoint_openai, min_replicas, "
            "max_replicas): min_replicas 5 exceeds" in msg
        ), msg
    else:
        assert "a user or password in the URI would be recorded with the spec" in msg, msg


def test_parse_spec_takes_a_mapping_or_a_spec_already_made():
    spec = parse_spec({"name": "tiny", "data": "/d"}, Small, origin="parameters")
    assert parse_spec(spec, Small) is spec
    with pytest.raises(SpecError, match="^parameters: unknown key 'x'"):
        parse_spec({"name": "tiny", "data": "/d", "x": 1}, Small, origin="parameters")


def _release(**deploy) -> dict:
    data = yaml.safe_load((ROOT / "releases" / "minilm-embedder.yaml").read_text())
    data["validation"]["sentences"] = str(ROOT / "releases" / "data" / "embedding-validation.txt")
    data["deploy"] = deploy
    return data


def test_a_union_sections_error_names_the_variant_chosen():
    with pytest.raises(SpecError) as info:
        parse_spec(_release(target="docker", replicas=3), ReleaseSpec)
    assert "unknown key 'deploy.replicas' (deploy.target 'docker')" in str(info.value)
    with pytest.raises(SpecError) as info:
        parse_spec(_release(target="heroku"), ReleaseSpec)
    msg = str(info.value)
    assert "'deploy.target' = 'heroku': use one of" in msg and "'local-triton'" in msg


@pytest.mark.parametrize("host", ["http://127.0.0.1:8000", "127.0.0.1:8000", "my host"])
def test_a_host_with_a_scheme_or_port_is_refused_naming_the_port_keys(host):
    with pytest.raises(SpecError) as info:
        parse_spec(_release(target="local-triton", host=host), ReleaseSpec)
    msg = str(info.value)
    assert f"'deploy.host' = {host!r}: {host!r} is not a host name or IPv4 address" in msg, msg
    assert "http_port" in msg
    for host in ("0.0.0.0", "triton.internal"):
        assert parse_spec(_release(target="local-triton", host=host), ReleaseSpec).deploy.host
