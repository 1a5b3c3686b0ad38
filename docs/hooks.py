"""MkDocs hooks: the parts of the site that are facts of the code are generated from it at build
time, so they cannot drift from it: the spec reference from the JSON Schema of the pydantic spec
models (`hf2triton schema`), the error-code table from the classes in hf2triton/errors.py.

A page asks for a generated part with a marker line, e.g. `<!-- generated: release spec -->`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
# The site documents this checkout's code, whichever copy of hf2triton is installed.
sys.path.insert(0, str(ROOT))

from hf2triton import errors  # noqa: E402
from hf2triton.spec.schema import json_schema  # noqa: E402


def on_page_markdown(markdown: str, page, config, files) -> str:
    for marker, make in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    if "<!-- check: every error code -->" in markdown:
        _check_every_code_has_a_remedy(markdown, page.file.src_uri)
    return markdown


# --- the spec reference --------------------------------------------------------------------------


class _Reference:
    """Markdown for one spec's schema: a section per object, in the order a spec is written,
    each with a table of its keys (type, default, description). A definition used in several
    places (the model store of three targets) is shown once and linked from the others."""

    def __init__(self, schema: dict[str, Any], prefix: str = ""):
        self.prefix = prefix  # keeps two specs' anchors apart on one page
        self.defs = schema.get("$defs", {})
        self.schema = schema
        self.anchor_of: dict[str, str] = {}  # definition name -> anchor of its section
        self.union_at: dict[tuple[str, ...], str] = {}  # a union's variants -> its key path
        self.out: list[str] = []

    def render(self) -> str:
        self._section("", self.schema, "Top level")
        return "\n".join(self.out) + "\n"

    # -- sections

    def _section(
        self,
        path: str,
        node: dict[str, Any],
        title: str,
        anchor: str = "",
        skip: frozenset[str] = frozenset(),
    ) -> None:
        self.out += [f"## {title} {{ #{anchor or self._anchor(path or 'top-level')} }}", ""]
        if node.get("description"):
            self.out += [_escape(" ".join(node["description"].split())), ""]
        nested: list[tuple[str, dict[str, Any]]] = []
        rows = []
        required = set(node.get("required", []))
        for key, prop in node.get("properties", {}).items():
            if key in skip:
                continue
            key_path = f"{path}.{key}" if path else key
            rows.append(
                (
                    f"`{key_path}`",
                    self._type(key_path, prop, nested),
                    self._default(key, prop, required),
                    _escape(" ".join(self._description(prop).split())),
                )
            )
        if rows:
            self.out += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
            self.out += ["| " + " | ".join(row) + " |" for row in rows]
            self.out.append("")
        for key_path, child in nested:
            self._nested(key_path, child)

    def _nested(self, path: str, node: dict[str, Any]) -> None:
        union = node.get("oneOf")
        if union and "discriminator" in node:
            self._union(path, node)
            return
        if union and "x-chosen-by-key" in node:
            self._keyed_union(path, node)
            return
        name = node["$ref"].rsplit("/", 1)[1]
        self._section(path, self.defs[name], f"`{path}`")

    def _union(self, path: str, node: dict[str, Any]) -> None:
        """A section with one variant per tag value: the keys every variant shares first, then
        each variant's own."""
        tag = node["discriminator"]["propertyName"]
        value_of = {ref: value for value, ref in node["discriminator"]["mapping"].items()}
        # In the order the code lists them (the default first), not the mapping's A-Z.
        variants = {value_of[v["$ref"]]: v["$ref"].rsplit("/", 1)[1] for v in node["oneOf"]}
        schemas = [self.defs[name] for name in variants.values()]
        shared = {
            key: prop
            for key, prop in schemas[0].get("properties", {}).items()
            if key != tag and all(s.get("properties", {}).get(key) == prop for s in schemas[1:])
        }
        common = {
            "description": f"`{path}` is one section per `{tag}`; these keys are read "
            f"whatever the `{tag}`.",
            "properties": shared,
        }
        self._section(path, common, f"`{path}`: every `{tag}`")
        for value, name in variants.items():
            anchor = self._anchor(f"{path}-{tag}-{value}")
            self.anchor_of.setdefault(name, anchor)
            self._section(
                path,
                self.defs[name],
                f"`{path}` with `{tag}: {value}`",
                anchor,
                skip=frozenset(shared),
            )

    def _keyed_union(self, path: str, node: dict[str, Any]) -> None:
        """A section that is the variant whose own key it holds (a source): the keys every
        variant shares first, then each variant's own."""
        variants = {key: ref.rsplit("/", 1)[1] for key, ref in node["x-chosen-by-key"].items()}
        schemas = [self.defs[name] for name in variants.values()]
        shared = {
            key: prop
            for key, prop in schemas[0].get("properties", {}).items()
            if all(s.get("properties", {}).get(key) == prop for s in schemas[1:])
        }
        common = {
            "description": f"`{path}` holds exactly one of "
            f"{', '.join(f'`{k}`' for k in variants)}, which says what else it may hold; "
            "these keys it may hold whichever it is.",
            "properties": shared,
        }
        self._section(path, common, f"`{path}`: every kind")
        for key, name in variants.items():
            anchor = self._anchor(f"{path}-{key}")
            self.anchor_of.setdefault(name, anchor)
            self._section(
                path, self.defs[name], f"`{path}` with `{key}`", anchor, skip=frozenset(shared)
            )

    def _anchor(self, path: str) -> str:
        return self.prefix + _anchor(path)

    # -- cells

    def _type(self, path: str, prop: dict[str, Any], nested: list) -> str:
        if "oneOf" in prop and "discriminator" in prop:
            tag = prop["discriminator"]["propertyName"]
            variants = tuple(o["$ref"] for o in prop["oneOf"])
            if variants not in self.union_at:  # a union met again links to its first section
                self.union_at[variants] = path
                nested.append((path, prop))
            first = self.union_at[variants]
            value_of = {ref: value for value, ref in prop["discriminator"]["mapping"].items()}
            values = ", ".join(
                f"[`{value}`](#{self._anchor(f'{first}-{tag}-{value}')})"
                for value in (value_of[ref] for ref in variants)
            )
            return f"section, by `{tag}`: {values}"
        if "oneOf" in prop and "x-chosen-by-key" in prop:
            variants = tuple(o["$ref"] for o in prop["oneOf"])
            if variants not in self.union_at:
                self.union_at[variants] = path
                nested.append((path, prop))
            first = self.union_at[variants]
            keys = ", ".join(
                f"[`{key}`](#{self._anchor(f'{first}-{key}')})" for key in prop["x-chosen-by-key"]
            )
            return f"section, by the key it holds: {keys}"
        options = prop.get("anyOf", [prop])
        parts = [
            self._plain_type(path, option, nested)
            for option in options
            if option.get("type") != "null"
        ]
        nullable = len(parts) < len(options)
        return " or ".join(parts) + (" or `null`" if nullable else "")

    def _plain_type(self, path: str, node: dict[str, Any], nested: list) -> str:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[1]
            target = self.defs[name]
            if "enum" in target:
                return _one_of(target["enum"])
            if name not in self.anchor_of:
                self.anchor_of[name] = self._anchor(path)
                nested.append((path, node))
            return f"section ([below](#{self.anchor_of[name]}))"
        if "const" in node:
            return _one_of([node["const"]]).removeprefix("one of ")
        if "enum" in node:
            return _one_of(node["enum"])
        kind = node.get("type", "any")
        if kind == "array":
            if "prefixItems" in node:
                items = ", ".join(self._plain_type(path, i, nested) for i in node["prefixItems"])
                return f"[{items}]"
            text = f"list of {self._plain_type(path + '[]', node.get('items', {}), nested)}"
            if node.get("minItems"):
                text += f" (at least {node['minItems']})"
            return text
        return kind + _bounds(node)

    def _default(self, key: str, prop: dict[str, Any], required: set[str]) -> str:
        if key in required:
            return "**required**"
        if "default" not in prop:
            return ""
        value = prop["default"]
        if isinstance(value, dict):
            return "its defaults"
        return f"`{value if isinstance(value, str) else json.dumps(value)}`"

    def _description(self, prop: dict[str, Any]) -> str:
        """The key's own description, else the first sentence of its section's."""
        if prop.get("description"):
            return prop["description"]
        refs = [o["$ref"] for o in prop.get("anyOf", [prop]) if "$ref" in o]
        section = self.defs[refs[0].rsplit("/", 1)[1]] if refs else {}
        text = " ".join(section.get("description", "").split())
        # A sentence ends at ". " before a capital or code, outside code spans ("e.g. a" does not).
        ends = [
            m.end()
            for m in re.finditer(r"\.\s(?=[A-Z`])", text)
            if text[: m.start()].count("`") % 2 == 0
        ]
        return text[: ends[0]].strip() if ends else text


def _bounds(node: dict[str, Any]) -> str:
    low = node.get("minimum", node.get("exclusiveMinimum"))
    high = node.get("maximum", node.get("exclusiveMaximum"))
    low_op = ">" if "exclusiveMinimum" in node else ">="
    high_op = "<" if "exclusiveMaximum" in node else "<="
    if low is not None and high is not None and low_op == ">=" and high_op == "<=":
        return f" ({low} to {high})"
    bounds = [
        f"{low_op} {low}" if low is not None else "",
        f"{high_op} {high}" if high is not None else "",
    ]
    shown = ", ".join(b for b in bounds if b)
    return _escape(f" ({shown})") if shown else ""


def _one_of(values: list[Any]) -> str:
    return "one of " + ", ".join(
        f"`{json.dumps(v) if not isinstance(v, str) else v}`" for v in values
    )


def _anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def _escape(text: str) -> str:
    """Text for a table cell: Markdown's special characters outside code spans are literal."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts lie outside code spans
        parts[i] = (
            re.sub(r"([\\*_\[\]{}])", r"\\\1", parts[i])
            .replace("<", "&lt;")
            .replace(">", "&gt;")
            .replace("|", "&#124;")
        )
    return "`".join(parts)


def spec_reference(which: str) -> str:
    return _Reference(json_schema(which), "" if which == "release" else f"{which}-").render()


# --- the error codes -----------------------------------------------------------------------------


def _error_classes() -> list[type[errors.Hf2TritonError]]:
    found, todo = [], [errors.Hf2TritonError]
    while todo:
        cls = todo.pop(0)
        found.append(cls)
        todo += cls.__subclasses__()
    return [c for c in found if c.__module__ == errors.__name__]


def error_codes() -> str:
    rows = ["| code | exit | retried | what it means | |", "| --- | --- | --- | --- | --- |"]
    for cls in _error_classes():
        meaning = _escape(" ".join((cls.__doc__ or "").split()))
        retried = "yes" if cls.retryable else "no"
        rows.append(
            f"| `{cls.code}` | {cls.exit_code} | {retried} | {meaning} | "
            f"[what to do](#{cls.code.lower()}) |"
        )
    return "\n".join(rows) + "\n"


def _check_every_code_has_a_remedy(markdown: str, page: str) -> None:
    """Each error code has a "### CODE" section saying what to do, and no section names a code
    that no longer exists (UNEXPECTED is the CLI's own, for a bug)."""
    codes = {cls.code for cls in _error_classes()}
    headed = set(re.findall(r"^### `?([A-Z0-9_]+)`?\s*$", markdown, re.M))
    missing, unknown = codes - headed, headed - codes - {"UNEXPECTED"}
    if missing or unknown:
        raise PluginError(
            f"{page}: error codes without a '### CODE' section: {sorted(missing)}; "
            f"sections for codes hf2triton/errors.py does not define: "
            f"{sorted(unknown)}"
        )


GENERATED = {
    "<!-- generated: release spec -->": lambda: spec_reference("release"),
    "<!-- generated: training spec -->": lambda: spec_reference("training"),
    "<!-- generated: error codes -->": error_codes,
}
