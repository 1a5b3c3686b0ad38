"""hf2triton/serving/structured.py: a JSON Schema becomes a grammar that accepts the compact JSON
values the schema validates and refuses the others, and a schema part the grammar cannot
enforce is refused with its path. The grammar is checked here by matching texts against it,
each rule expanded into a regular expression (recursion cut a few levels deep)."""

from __future__ import annotations

import json
import re

import pytest

from hf2triton.serving.structured import SchemaError, schema_grammar

TOKEN = re.compile(
    r'\s*(?:(?P<lit>"(?:[^"\\]|\\.)*")|(?P<cls>\[(?:[^\]\\]|\\.)*\])|(?P<rep>\{\d*,?\d*\})'
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[()|*+?]))"
)


def parse_rules(grammar: str) -> dict[str, str]:
    rules = {}
    for line in grammar.splitlines():
        if "::=" in line:
            name, rhs = line.split("::=", 1)
            rules[name.strip()] = rhs.strip()
    return rules


def to_regex(rules: dict[str, str], name: str, depth: int = 0) -> str:
    if depth > 12:
        return "(?!)"  # deeper than any text here nests: matches nothing
    out, rhs, pos = [], rules[name], 0
    while pos < len(rhs.rstrip()):
        m = TOKEN.match(rhs, pos)
        assert m, f"cannot read rule {name} at {rhs[pos:]!r}"
        pos = m.end()
        if m["lit"]:
            out.append(re.escape(re.sub(r"\\(.)", r"\1", m["lit"][1:-1])))
        elif m["cls"]:
            out.append(m["cls"])
        elif m["name"]:
            out.append(f"(?:{to_regex(rules, m['name'], depth + 1)})")
        else:
            out.append(m["rep"] or m["op"].replace("(", "(?:"))
    return "".join(out)


def accepts(schema, value) -> bool:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return re.fullmatch(to_regex(parse_rules(schema_grammar(schema)), "root"), text) is not None


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 5},
        "age": {"type": "integer"},
        "mood": {"enum": ["ok", "sad"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "value",
    [
        {"name": "ann", "age": 3},
        {"name": "", "age": -12, "mood": "sad"},
        {"name": "bo", "age": 0, "tags": [True, False]},
        {"name": "bo", "age": 7, "mood": "ok", "tags": [False]},
    ],
)
def test_values_the_schema_validates_are_accepted(value):
    assert accepts(PERSON, value)


@pytest.mark.parametrize(
    "value",
    [
        {"age": 3},  # a required property missing
        {"name": "ann", "age": 3.5},  # not an integer
        {"name": "toolong", "age": 3},  # over maxLength
        {"name": "ann", "age": 3, "mood": "glad"},  # not in the enum
        {"name": "ann", "age": 3, "tags": []},  # under minItems
        {"name": "ann", "age": 3, "tags": [True, True, True]},  # over maxItems
        {"age": 3, "name": "ann"},  # properties come in the schema's order
        {"name": "ann", "age": 3, "other": 1},  # additionalProperties false
        '{"name": "ann", "age": 3}',  # not compact
    ],
)
def test_values_the_schema_refuses_are_refused(value):
    assert not accepts(PERSON, value)


def test_refs_anyof_consts_and_optional_only_objects():
    tree = {
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "v": {"const": 1},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/Node",
    }
    assert accepts(tree, {"v": 1, "kids": [{"v": 1}, {"v": 1, "kids": []}]})
    assert not accepts(tree, {"v": 2})
    either = {"anyOf": [{"type": "integer"}, {"type": "null"}], "title": "ignored"}
    assert accepts(either, 42) and accepts(either, None) and not accepts(either, "x")
    loose = {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}}
    for value in ({}, {"a": True}, {"b": None}, {"a": False, "b": None}):
        assert accepts(loose, value), value
    assert not accepts(loose, {"b": None, "a": True})
    assert accepts({"type": ["string", "number"]}, 1.25e3)
    assert accepts(
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
        ["a", 1],
    )
    assert not accepts({"type": "array", "prefixItems": [{"type": "string"}], "items": False}, [1])


@pytest.mark.parametrize(
    "schema, path",
    [
        ({"type": "string", "pattern": "^a"}, "$.pattern"),
        (
            {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}},
            "$.properties.n.minimum",
        ),
        ({"type": "object", "properties": {"p": {"$ref": "#/$defs/Nope"}}}, "$.properties.p.$ref"),
        ({"$ref": "http://example.com/schema"}, "$.$ref"),
        ({"type": "object", "required": ["x"]}, "$.required"),
        ({"type": "strin"}, "$.type"),
        ({"type": "integer", "maxLength": 3}, "$.maxLength"),
        ({"type": "array", "minItems": 3, "maxItems": 1}, "$.maxItems"),
        ({"enum": []}, "$.enum"),
        ({"anyOf": "x"}, "$.anyOf"),
        ("{not json", "$"),
    ],
)
def test_what_the_grammar_cannot_enforce_is_refused_naming_its_path(schema, path):
    with pytest.raises(SchemaError) as caught:
        schema_grammar(schema)
    assert caught.value.path == path
    assert str(caught.value).startswith(f"{path}: ")


def test_a_schema_given_as_json_text_is_the_same_grammar():
    assert schema_grammar(json.dumps(PERSON)) == schema_grammar(PERSON)
