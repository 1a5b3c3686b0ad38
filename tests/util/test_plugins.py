"""Plug-in registries: a plug-in registers itself by its own name, a broken or duplicate one is
refused when its module is imported, and the spec section a registry makes chooses a variant by
its tag (or by the one key of its own it holds) with errors that name the variants."""

from __future__ import annotations

import abc
from typing import ClassVar, Literal

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from hf2triton.util.plugins import Registry, tag_of
from hf2triton.util.specbase import Strict


def _registry() -> Registry:
    reg = Registry(lambda cls: tag_of(cls, "kind"), default="local")

    @reg.register
    class Local(Strict):
        kind: Literal["local"] = "local"
        folder: str = "/srv"

    @reg.register
    class Bucket(Strict):
        kind: Literal["s3"]
        bucket: str

    return reg


def test_a_plug_in_is_found_by_the_name_it_declares():
    reg = _registry()
    assert sorted(reg) == ["local", "s3"]
    assert reg.load("s3").__name__ == "Bucket"
    assert [c.__name__ for c in reg.classes()] == ["Local", "Bucket"]
    with pytest.raises(KeyError):
        reg.load("gcs")


def test_two_plug_ins_of_one_name_are_refused():
    reg = _registry()

    class Other(Strict):
        kind: Literal["s3"] = "s3"

    with pytest.raises(ValueError, match="two plug-ins are named 's3'"):
        reg.register(Other)
    assert reg.load("s3").__name__ == "Bucket"  # the first one stays
    reg.register(reg.load("s3"))  # registering the same class again is no conflict


def test_a_plug_in_missing_an_abstract_method_is_refused_at_registration():
    class Base(abc.ABC):
        name: ClassVar[str]

        @abc.abstractmethod
        def deploy(self) -> None: ...

        @abc.abstractmethod
        def retire(self) -> None: ...

    reg = Registry(lambda cls: cls.name, default="x")

    class Half(Base):
        name = "half"

        def deploy(self) -> None:
            pass

    with pytest.raises(TypeError, match="Half cannot be registered: it does not implement retire"):
        reg.register(Half)
    assert "half" not in reg


def test_union_chooses_the_variant_by_its_tag_and_the_default_without_one():
    section = TypeAdapter(_registry().union("kind"))
    assert type(section.validate_python({})).__name__ == "Local"
    bucket = section.validate_python({"kind": "s3", "bucket": "models"})
    assert type(bucket).__name__ == "Bucket" and bucket.bucket == "models"
    # Each variant has only its own keys: a local store has no bucket.
    with pytest.raises(ValidationError) as info:
        section.validate_python({"kind": "local", "bucket": "models"})
    assert [e["loc"] for e in info.value.errors()] == [("local", "bucket")]
    with pytest.raises(ValidationError) as info:
        section.validate_python({"kind": "gcs"})
    assert info.value.errors()[0]["type"] == "union_tag_invalid"


def test_keyed_union_chooses_the_one_plug_in_whose_key_is_given():
    reg = Registry(lambda cls: cls.name, default="path")

    @reg.register
    class PathSource(BaseModel):
        key: ClassVar[str] = "path"
        name: ClassVar[str] = "path"
        path: str | None = None

    @reg.register
    class HubSource(BaseModel):
        key: ClassVar[str] = "repo_id"
        name: ClassVar[str] = "hub"
        repo_id: str | None = None
        revision: str = "main"

    section = TypeAdapter(reg.keyed_union())
    assert isinstance(section.validate_python({"path": "/m"}), PathSource)
    hub = section.validate_python({"repo_id": "org/m", "revision": "v1", "path": None})
    assert isinstance(hub, HubSource) and hub.revision == "v1"  # another's empty key ignored
    for given, got in (({"path": "/m", "repo_id": "org/m"}, "['path', 'repo_id']"), ({}, "none")):
        with pytest.raises(ValidationError) as info:
            section.validate_python(given)
        assert f"give exactly one of path or repo_id (got {got})" in str(info.value)
    # An object already validated passes as it is.
    assert section.validate_python(hub) is hub


def test_tag_of_reads_the_name_a_section_declares():
    assert tag_of(_registry().load("s3"), "kind") == "s3"
