"""JSON as the release hands it on: a flow's summary, a step's record, what the CLI prints. The
steps type what they read of it; these name the rest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias, Union, cast

# A JSON value, recursively (a flow's result is printed as one JSON line, stored by Prefect);
# read-only containers, so a list[str] or a dict[str, float] is one.
JSONValue: TypeAlias = Union[  # noqa: UP007 - a recursive alias needs the string form
    str, int, float, bool, None, Sequence["JSONValue"], Mapping[str, "JSONValue"]
]
JSONObject: TypeAlias = dict[str, JSONValue]
# What a spec is before it is parsed: YAML's mapping, or Prefect's deployment parameters.
RawSpec: TypeAlias = dict[str, object]


def json_object(value: Mapping[str, object]) -> JSONObject:
    """A step's TypedDict result as the JSON object it is (to the checker a TypedDict is a
    Mapping[str, object]: its values' types are its keys')."""
    return cast(JSONObject, dict(value))
