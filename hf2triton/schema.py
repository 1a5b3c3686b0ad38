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

from pydantic import BaseModel, TypeAdapter

from hf2triton.spec import ReleaseSpec, TrainingSpec
from hf2triton.workspace import PROJECT_ROOT

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
    _default_variant_takes_no_tag(schema, entry.model)
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


def _default_variant_takes_no_tag(schema: dict[str, Any], model: Any) -> None:
    """A section of a discriminated union that leaves out its tag means the field's default
    variant (ReleaseSpec fills in `deploy.target: local-triton`), so the schema must not demand
    the tag there. pydantic's schema cannot know that a before-validator supplies it."""
    for name, field in getattr(model, "model_fields", {}).items():
        tag = field.discriminator
        default = field.get_default(call_default_factory=True)
        if not isinstance(tag, str) or not isinstance(default, BaseModel):
            continue
        mapping = schema["properties"][name].get("discriminator", {}).get("mapping", {})
        ref = mapping.get(getattr(default, tag, None))
        if ref is None:
            continue
        variant = schema["$defs"][ref.rsplit("/", 1)[1]]
        required = [key for key in variant.get("required", []) if key != tag]
        if required:
            variant["required"] = required
        else:
            variant.pop("required", None)
