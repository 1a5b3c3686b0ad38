"""The building blocks of every spec section: unknown keys refused, sections frozen, names valid
for MLflow, Docker and Triton at once, paths relative to the spec file."""

from __future__ import annotations

import re
from typing import Annotated

import pytest
from pydantic import ValidationError

from hf2triton.util.specbase import (
    MaxLength,
    Name,
    Probability,
    SpecPath,
    Strict,
    check_name,
    first_line,
    matching,
    unless,
)


class Section(Strict):
    name: Name
    data: SpecPath = "data.txt"
    floor: Probability = 0.9
    max_length: MaxLength = None


def test_a_section_refuses_unknown_keys_and_is_frozen():
    with pytest.raises(ValidationError) as info:
        Section(name="minilm", colour="blue")
    assert info.value.errors()[0]["type"] == "extra_forbidden"
    section = Section(name="minilm")
    with pytest.raises(ValidationError):
        section.name = "other"


@pytest.mark.parametrize("name", ["minilm-embedder", "a", "model_2.1", "x" * 63, "0day", "a.b-c_d"])
def test_valid_names(name):
    assert check_name(name) == name
    assert Section(name=name).name == name


@pytest.mark.parametrize(
    "name", ["", "MiniLM", "a/b", "a b", "a..b", "-lead", ".hidden", "x" * 64, "café", "../up"]
)
def test_invalid_names_say_what_a_name_is(name):
    with pytest.raises(ValueError, match="is not a valid name: use 1-63 characters"):
        check_name(name)
    with pytest.raises(ValidationError, match="MLflow model name, a Docker tag"):
        Section(name=name)


def test_paths_are_relative_to_the_spec_files_folder(tmp_path):
    ctx = {"base_dir": str(tmp_path)}
    given = Section.model_validate({"name": "m", "data": "data.txt"}, context=ctx).data
    assert given == str(tmp_path / "data.txt")
    got = Section.model_validate({"name": "m", "data": "../v/x.txt"}, context=ctx).data
    assert got == str(tmp_path.parent / "v" / "x.txt")
    assert Section.model_validate({"name": "m", "data": "/abs/x.txt"}, context=ctx).data == (
        "/abs/x.txt"
    )
    # No spec file (a mapping given in code): relative stays relative.
    assert Section.model_validate({"name": "m", "data": "d/./x.txt"}).data == "d/x.txt"


def test_value_ranges():
    assert Section(name="m", floor=-1.0, max_length=8192).floor == -1.0
    for bad in ({"floor": 1.5}, {"max_length": 0}, {"max_length": 8193}):
        with pytest.raises(ValidationError):
            Section(name="m", **bad)


def test_matching_and_unless_give_the_message_a_user_reads():
    class Cron(Strict):
        cron: Annotated[str, matching(re.compile(r"^\S+( \S+){4}$"), "a cron line of 5 fields")]

    assert Cron(cron="0 3 * * 1").cron == "0 3 * * 1"
    with pytest.raises(ValidationError, match="'weekly' is not a cron line of 5 fields"):
        Cron(cron="weekly")
    assert unless(False, 3, "never") == 3
    with pytest.raises(ValueError, match="^min above max$"):
        unless(True, 3, "min above max")


def test_first_line_is_a_docstrings_first_paragraph_on_one_line():
    doc = """
        The local server's own directory,
        or each replica's folder.

        More detail nobody reads in a schema.
    """
    assert first_line(doc) == "The local server's own directory, or each replica's folder."
    assert first_line(None) == ""
