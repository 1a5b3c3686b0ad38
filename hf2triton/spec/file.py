"""Reading a spec: YAML into the spec models (hf2triton.spec), every validation error turned into
one line that names the key, the value and, for a union section, the variant chosen."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from hf2triton.errors import SpecError
from hf2triton.sources import SOURCES
from hf2triton.stores import STORES
from hf2triton.targets import TARGETS
from hf2triton.util.workspace import redact_text, redact_uri

# Union sections name their variant in an error's location: (section, {variant names}); a
# section chosen by the key it holds (a source) has no tag key (None).
_VARIANTS = {
    "deploy": ("target", TARGETS),
    "model_store": ("kind", STORES),
    "source": (None, SOURCES),
    "base": (None, SOURCES),
}


def _branch(part: Any) -> bool:
    """A location part pydantic adds for the branch of a union it tried ("literal['auto']",
    "list[...]", "function-after[...]"): not a key of the spec."""
    return isinstance(part, str) and "[" in part


def _relevant(errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """A list given for `'auto' | [...]` whose items are wrong fails both branches; the
    literal's complaint ("should be 'auto'") says nothing the items' errors do not."""

    def key(e: ErrorDetails) -> tuple[str | int, ...]:
        return tuple(p for p in e["loc"] if not _branch(p))

    inner = [key(e) for e in errors if e["type"] != "literal_error"]
    return [
        e
        for e in errors
        if not (
            e["type"] == "literal_error"
            and any(_branch(p) for p in e["loc"])
            and any(len(k) > len(key(e)) and k[: len(key(e))] == key(e) for k in inner)
        )
    ]


def _describe(err: ErrorDetails) -> str:
    loc: list[int | str] = []
    variant, tagged = None, -1
    for part in (p for p in err["loc"] if not _branch(p)):
        # A union puts the chosen variant's name into the location: name it once, by its key.
        # (Once per section: a source's own key may share its variant's name, `mlflow`.)
        if (
            loc
            and str(loc[-1]) in _VARIANTS
            and part in _VARIANTS[str(loc[-1])][1]
            and tagged != len(loc)
        ):
            tagged = len(loc)
            tag = _VARIANTS[str(loc[-1])][0]
            variant = (
                f"{'.'.join(str(p) for p in loc)}.{tag} {part!r}" if tag else f"a {part} source"
            )
            continue
        loc.append(part)
    key = ".".join(str(p) for p in loc) or "(top level)"
    for_variant = f" ({variant})" if variant else ""
    if err["type"] == "extra_forbidden":
        return f"unknown key '{key}'{for_variant}"
    if err["type"] == "missing":
        return f"missing key '{key}'{for_variant}"
    if err["type"] == "union_tag_invalid":
        field, names = _VARIANTS.get(str(loc[-1]), ("target", TARGETS))
        tag = (err.get("ctx") or {}).get("tag")
        return f"'{key}.{field}' = {tag!r}: use one of {', '.join(repr(t) for t in names)}"
    # A URI's password never reaches an error line, in the value or in the message.
    msg, shown = err["msg"].removeprefix("Value error, "), err.get("input")
    if isinstance(shown, str) and "://" in shown:
        shown = redact_uri(shown)
        msg = msg.replace(err["input"], shown)
    msg = redact_text(msg)
    if err["type"] in ("model_type", "dict_type", "model_attributes_type"):
        msg = "a section is a mapping of keys (key: value lines indented under it)"
    elif err["type"] == "string_type" and type(shown) in (int, float):
        msg = f"text is wanted here: put it in quotes, as YAML reads {shown!r} as a number"
    if not loc:  # a rule across keys: the message names them; the input is the whole spec
        return msg
    if isinstance(shown, dict):  # a section: its keys, not their values (a password)
        return f"'{key}' (keys given: {', '.join(map(str, shown)) or 'none'}): {msg}{for_variant}"
    return f"'{key}' = {redact_text(repr(shown))}: {msg}{for_variant}"


# The spec model a file or mapping is read as.
M = TypeVar("M", bound=BaseModel)


def parse_spec(
    data: object, model: type[M], base_dir: str | Path | None = None, origin: str = "spec"
) -> M:
    """Validate a spec given as a mapping as `model`; relative paths are taken from
    `base_dir`."""
    if isinstance(data, model):
        return data
    if not isinstance(data, dict):
        what = "an empty document" if data is None else f"a {type(data).__name__}"
        raise SpecError(f"{origin}: a spec is a YAML mapping of keys, got {what}")
    try:
        return model.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        problems = "; ".join(_describe(e) for e in _relevant(exc.errors()))
        raise SpecError(f"{origin}: {problems}. Fix the spec and run again.") from None


def load_spec(path: str | Path, model: type[M]) -> M:
    """Read and validate a spec YAML file as `model`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"spec file {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"spec file {str(p)!r} cannot be read: {exc}") from None
    try:
        data = yaml.load(text, Loader=_SpecLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise SpecError(f"spec file {str(p)!r} is not valid YAML{_yaml_problem(exc)}") from None
    return parse_spec(data, model, base_dir=p.resolve().parent, origin=str(p))


class _SpecLoader(yaml.SafeLoader):
    """YAML's safe loader refusing a key given twice in one mapping (else the last one wins
    without a word). Each mapping's own keys are checked once, before merge keys (`<<: *base`)
    paste another mapping's keys into it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        if id(node) not in self._checked:
            self._checked.add(id(node))
            seen: dict[str, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue
                line = key_node.start_mark.line + 1
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key_node.value!r} is given twice (lines {seen[key_node.value]} "
                        f"and {line}): keep one",
                        key_node.start_mark,
                    )
                seen[key_node.value] = line
        super().flatten_mapping(node)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what YAML's parser found, on one line: not its quote of the text (a line
    of the spec that may hold a secret)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or type(exc).__name__
    context, at = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and at:
        problem += f" ({context} at line {at.line + 1})"
    return redact_text(f"{where}: {problem}")
