"""The JSON Schema of the release (and training) spec, generated from the pydantic models, so an
editor validates and completes a spec as it is typed and the documentation's spec reference is
built from the same descriptions the code carries.

Example:
    >>> schema = json_schema("release")
    >>> schema["properties"]["source"]["$ref"]
    '#/$defs/SourceSpec'
    >>> stale("release", PROJECT_ROOT / SCHEMAS["release"].path) is None   # committed and fresh
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from hf2triton.spec import ReleaseSpec, TrainingSpec
from hf2triton.util.workspace import PROJECT_ROOT  # noqa: F401 - the example above uses it

DIALECT = "https://json-schema.org/draft/2020-12/schema"  # what pydantic generates


@dataclass(frozen=True)
class SchemaFile:
    model: Any  # a pydantic model, or a type a TypeAdapter takes (a union of models)
    path: str  # the committed copy, relative to the project root
    title: str


SCHEMAS: dict[str, SchemaFile] = {
    "release": SchemaFile(ReleaseSpec, "schema/release-spec.json", "hf2triton release spec"),
    "training": SchemaFile(TrainingSpec, "schema/training-spec.json", "hf2triton training spec"),
}


def json_schema(which: str = "release") -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one spec kind, as the pydantic model describes it."""
    entry = SCHEMAS[which]
    schema = TypeAdapter(entry.model).json_schema()
    _name_the_variants(schema)
    return {"$schema": DIALECT, **schema, "title": entry.title}


def render(which: str = "release") -> str:
    """The schema as the committed file holds it."""
    return json.dumps(json_schema(which), indent=2, ensure_ascii=False) + "\n"


def stale(which: str, path: Path) -> str | None:
    """Why `path` is not the schema the models give now, or None when it is."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    return None if text == render(which) else f"{path} is out of date with the spec models"


def _name_the_variants(schema: dict[str, Any]) -> None:
    """A plug-in section (deploy by `target`, model_store by `kind`) is a union whose variant a
    tag names, and whose default variant may leave the tag out, so pydantic writes a bare
    `oneOf`. Name the tag and its values (OpenAPI's `discriminator`, which editors and the
    documentation read); validation is unchanged: each variant's tag is a `const`."""
    defs = schema.get("$defs", {})

    def visit(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item)
            return
        if not isinstance(node, dict):
            return
        refs = [v.get("$ref", "") for v in node.get("oneOf", [])]
        if refs and all(refs) and "discriminator" not in node:
            variants = [defs[r.rsplit("/", 1)[1]].get("properties", {}) for r in refs]
            tags = [
                k
                for k, v in variants[0].items()
                if "const" in v and all("const" in other.get(k, {}) for other in variants[1:])
            ]
            if tags:
                node["discriminator"] = {
                    "propertyName": tags[0],
                    "mapping": {props[tags[0]]["const"]: ref for props, ref in zip(variants, refs)},
                }
            else:  # chosen by the key it holds (a source): each variant requires its own
                own = [
                    [
                        k
                        for k in defs[r.rsplit("/", 1)[1]].get("required", [])
                        if all(k not in other for other in variants if other is not props)
                    ]
                    for r, props in zip(refs, variants)
                ]
                if all(len(keys) == 1 for keys in own):
                    node["x-chosen-by-key"] = {keys[0]: ref for keys, ref in zip(own, refs)}
        for value in node.values():
            visit(value)

    visit(schema)
