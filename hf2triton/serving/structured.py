"""Structured output: a JSON Schema turned into the grammar (XGrammar's EBNF) that constrains
decoding, so every token the engine may pick keeps the text on its way to a JSON value that
validates. The JSON is compact (no whitespace between tokens: a model is never free to spend its
tokens on blanks), numbers have at most 16 digits, and what the grammar cannot enforce is
refused with the path of the schema part, never dropped: a `pattern` the schema asks for and
the grammar would not check would give output that does not validate.

Supported: `type` (object, array, string, integer, number, boolean, null, or a list of them),
`properties`/`required`/`additionalProperties` (properties come in the order the schema lists
them), `items`/`prefixItems`/`minItems`/`maxItems`, `enum`, `const`, `anyOf` (and `oneOf` where
its branches cannot overlap: different types or consts), `$ref` into `$defs`/`definitions`
(recursion included), `minLength`/`maxLength`. Annotations (`title`, `description`, `default`,
`examples`, `$schema`, `$id`, `$comment`, `strict`) are read and ignored. Anything else is
refused.

Part of the serving core: the standard library only.
"""

from __future__ import annotations

import json
import re
from typing import Any

ANNOTATIONS = {
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "strict",
    "deprecated",
    "readOnly",
    "writeOnly",
}
BY_TYPE = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems"},
    "string": {"minLength", "maxLength"},
    "integer": set(),
    "number": set(),
    "boolean": set(),
    "null": set(),
}
ANY_TYPE = {"type", "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions"}
MAX_DIGITS = 15  # after the first: JSON integers an int64 holds, and a number's fraction

# The rules every grammar shares: JSON's scalars, compact.
COMMON = r"""
json_string ::= "\"" json_char* "\""
json_char ::= [^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json_integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
json_number ::= json_integer ("." [0-9]{1,15})? ([eE] [+-]? [0-9]{1,2})?
json_value ::= json_object | json_array | json_string | json_number | "true" | "false" | "null"
json_object ::= "{" (json_string ":" json_value ("," json_string ":" json_value)*)? "}"
json_array ::= "[" (json_value ("," json_value)*)? "]"
"""


class SchemaError(ValueError):
    """A schema (or a part of it, named by its path) the grammar cannot enforce."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path


def literal(value: Any) -> str:
    """An EBNF string literal matching the compact JSON text of `value`."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Grammar:
    """Rules built from one schema: `root` and one rule per schema part."""

    def __init__(self, schema: Any):
        self.root = schema
        self.rules: dict[str, str] = {}
        self.refs: dict[str, str] = {}

    def text(self) -> str:
        start = self.rule(self.root, "$", "root_value")
        body = "\n".join(f"{name} ::= {rhs}" for name, rhs in self.rules.items())
        return f"root ::= {start}\n{body}\n{COMMON}"

    def rule(self, schema: Any, path: str, hint: str) -> str:
        """The name of a rule for `schema` (at `path`)."""
        name = re.sub(r"[^a-zA-Z0-9_]", "_", hint)[:40] + f"_{len(self.rules)}"
        self.rules[name] = ""  # reserved: a recursive $ref may name it before it is built
        self.rules[name] = self.expression(schema, path)
        return name

    def expression(self, schema: Any, path: str) -> str:
        if schema is True or schema == {}:
            return "json_value"
        if not isinstance(schema, dict):
            raise SchemaError(path, "a schema must be a JSON object (or true)")
        unknown = set(schema) - ANNOTATIONS - ANY_TYPE - set().union(*BY_TYPE.values())
        if unknown:
            raise SchemaError(
                f"{path}.{sorted(unknown)[0]}",
                "is not supported by constrained decoding (it would not be enforced); remove it",
            )
        if "$ref" in schema:
            return self.ref(schema["$ref"], f"{path}.$ref")
        if "const" in schema:
            return literal(schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError(f"{path}.enum", "must be a non-empty list")
            return " | ".join(literal(v) for v in values)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                branches = schema[key]
                if not isinstance(branches, list) or not branches:
                    raise SchemaError(f"{path}.{key}", "must be a non-empty list of schemas")
                return " | ".join(
                    self.rule(b, f"{path}.{key}[{i}]", f"{key}{i}") for i, b in enumerate(branches)
                )
        return self.typed(schema, path)

    def typed(self, schema: dict[str, Any], path: str) -> str:
        kinds = schema.get("type")
        if kinds is None:
            return "json_value"
        kinds = kinds if isinstance(kinds, list) else [kinds]
        bad = [k for k in kinds if k not in BY_TYPE]
        if bad or not kinds:
            raise SchemaError(
                f"{path}.type", f"{bad[0] if bad else kinds!r} is not a JSON Schema type"
            )
        for kind in kinds:  # a keyword of another type than the schema's is an error
            other = set(schema) & set().union(*BY_TYPE.values()) - set().union(
                *(BY_TYPE[k] for k in kinds)
            )
            if other:
                raise SchemaError(f"{path}.{sorted(other)[0]}", f"does not apply to type {kind}")
        alternatives = [getattr(self, f"_{k}")(schema, path) for k in kinds]
        return " | ".join(f"({a})" for a in alternatives)

    def ref(self, ref: Any, path: str) -> str:
        if not isinstance(ref, str) or not re.fullmatch(r"#/(\$defs|definitions)/[^/]+", ref):
            raise SchemaError(
                path, f"{ref!r}: only references into #/$defs or #/definitions are supported"
            )
        if ref not in self.refs:
            section, name = ref[2:].split("/", 1)
            target = (
                (self.root.get(section) or {}).get(name) if isinstance(self.root, dict) else None
            )
            if target is None:
                raise SchemaError(path, f"{ref} names no definition")
            rule = f"def_{re.sub(r'[^a-zA-Z0-9_]', '_', name)[:40]}_{len(self.refs)}"
            self.refs[ref] = rule
            self.rules[rule] = ""
            self.rules[rule] = self.expression(target, f"$.{section}.{name}")
        return self.refs[ref]

    def _object(self, schema: dict[str, Any], path: str) -> str:
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError(f"{path}.properties", "must be an object")
        required = schema.get("required", [])
        missing = [r for r in required if r not in props]
        if missing:
            raise SchemaError(
                f"{path}.required", f"names {missing[0]!r}, which properties does not define"
            )
        extra = schema.get("additionalProperties", True)
        if not props:
            return "json_object" if extra is not False else '"{" "}"'
        pairs = {
            k: f'{literal(k)} ":" {self.rule(v, f"{path}.properties.{k}", k)}'
            for k, v in props.items()
        }
        must = [pairs[k] for k in props if k in required]
        may = [pairs[k] for k in props if k not in required]
        if must:
            body = ' "," '.join(must) + "".join(f' ("," {p})?' for p in may)
        else:  # any in-order subset of the optional ones, commas between
            body = self._subset(may)
        return f'"{{" {body} "}}"'

    def _subset(self, pairs: list[str]) -> str:
        """Any in-order subset of `pairs`, commas between: S_i ::= p_i T_i+1 | S_i+1 and
        T_i ::= ("," p_i)? T_i+1, built from the last."""
        tail = start = ""
        for pair in reversed(pairs):
            s_rhs = pair + (f" {tail}" if tail else "") + (f" | {start}" if start else "")
            t_rhs = f'("," {pair})?' + (f" {tail}" if tail else "")
            start, tail = self._named(s_rhs), self._named(t_rhs)
        return f"({start})?"

    def _named(self, rhs: str) -> str:
        name = f"part_{len(self.rules)}"
        self.rules[name] = rhs
        return name

    def _array(self, schema: dict[str, Any], path: str) -> str:
        prefix = schema.get("prefixItems")
        if prefix is not None:  # a tuple: exactly these, in order
            if "items" in schema and schema["items"] is not False:
                raise SchemaError(
                    f"{path}.items",
                    "with prefixItems is not supported: give "
                    "items: false (a tuple) or no prefixItems",
                )
            parts = [
                self.rule(s, f"{path}.prefixItems[{i}]", f"item{i}") for i, s in enumerate(prefix)
            ]
            return '"[" ' + ' "," '.join(parts) + ' "]"' if parts else '"[" "]"'
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        if high is not None and int(high) < low:
            raise SchemaError(f"{path}.maxItems", "is below minItems")
        if high is not None and int(high) == 0:
            return '"[" "]"'
        item = self.rule(schema.get("items", True), f"{path}.items", "item")
        more = (
            f"{{{max(0, low - 1)},{int(high) - 1}}}"
            if high is not None
            else f"{{{max(0, low - 1)},}}"
        )
        body = f'{item} ("," {item}){more}'
        return f'"[" {body} "]"' if low >= 1 else f'"[" ({body})? "]"'

    def _string(self, schema: dict[str, Any], path: str) -> str:
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if high is None and not low:
            return "json_string"
        bounds = f"{{{int(low)},{int(high)}}}" if high is not None else f"{{{int(low)},}}"
        return f'"\\"" json_char{bounds} "\\""'

    def _integer(self, schema: dict[str, Any], path: str) -> str:
        return "json_integer"

    def _number(self, schema: dict[str, Any], path: str) -> str:
        return "json_number"

    def _boolean(self, schema: dict[str, Any], path: str) -> str:
        return '"true" | "false"'

    def _null(self, schema: dict[str, Any], path: str) -> str:
        return '"null"'


def schema_grammar(schema: Any) -> str:
    """The EBNF of the compact JSON values `schema` accepts; SchemaError naming the part it
    cannot enforce."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise SchemaError("$", f"is not JSON: {exc}") from None
    return Grammar(schema).text()
