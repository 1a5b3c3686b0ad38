"""Plug-in registries: each plug-in registers itself where it is defined (`@KINDS.register`,
as optimum's exporters register their model configs) in a table that lives in its package's base
module, and the package's `__init__` imports its plug-in modules in one line (no plug-in imports
its package back: no import cycle). A registry also makes the spec section that chooses one of
its plug-ins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar, Union, get_args

from pydantic import BeforeValidator, Discriminator, Tag

C = TypeVar("C", bound=type)


class Registry(dict[str, Any]):
    """Plug-in classes by name (the name each class declares, read by `key`), with the name a
    spec gets when it names none.

    Example:
        >>> KINDS = Registry(lambda cls: cls.task, default="feature-extraction")
        >>> @KINDS.register
        ... class EmbeddingKind: task = "feature-extraction"
        >>> KINDS.load("feature-extraction").__name__
        'EmbeddingKind'
    """

    def __init__(self, key: Callable[[Any], str], default: str):
        super().__init__()
        self.key, self.default = key, default

    def register(self, cls: C) -> C:
        """Register `cls` under its key (a decorator). A class that leaves an abstract method
        of its base unimplemented is refused here, when its module is imported, not deep in a
        release."""
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            raise TypeError(
                f"{cls.__name__} cannot be registered: it does not implement {', '.join(missing)}"
            )
        name = self.key(cls)
        if self.get(name, cls) is not cls:
            raise ValueError(f"two plug-ins are named {name!r}: {self[name]} and {cls}")
        self[name] = cls
        return cls

    def load(self, name: str) -> Any:
        return self[name]

    def classes(self) -> list[Any]:
        return list(self.values())

    def union(self, tag: str, section: Callable[[Any], Any] = lambda cls: cls) -> Any:
        """A spec section that is one plug-in's `section(cls)`, chosen by its `tag` key (a
        section without it is the default's): each variant has only its own keys, and a
        validation error names the variant."""

        def chosen(value: Any) -> str | None:
            return (
                value.get(tag, self.default)
                if isinstance(value, dict)
                else getattr(value, tag, None)
            )

        variants = tuple(Annotated[section(cls), Tag(name)] for name, cls in self.items())
        return Annotated[Union[variants], Discriminator(chosen)]  # noqa: UP007

    def keyed_union(self) -> Any:
        """A spec section that is the one plug-in whose own key (`cls.key`) it holds
        (`source: {path: ...}` is the path source): each variant has only its own keys, and
        holding none, or several, of the plug-ins' keys is an error naming them."""
        keys = {name: cls.key for name, cls in self.items()}

        def chosen(value: Any) -> str | None:
            if not isinstance(value, dict):
                return next((n for n, c in self.items() if isinstance(value, c)), None)
            found = [n for n, k in keys.items() if value.get(k) is not None]
            return found[0] if len(found) == 1 else None

        def exactly_one(value: Any) -> Any:
            if not isinstance(value, dict):
                return value
            given = [k for k in keys.values() if value.get(k) is not None]
            if len(given) != 1:
                *first, last = keys.values()
                raise ValueError(
                    f"give exactly one of {', '.join(first)} or {last} (got {given or 'none'})"
                )
            # Another plug-in's key left empty (`package: null`) is no key of this one.
            return {k: v for k, v in value.items() if v is not None or k not in keys.values()}

        variants = tuple(Annotated[cls, Tag(name)] for name, cls in self.items())
        return Annotated[
            Union[variants],  # noqa: UP007 - a tuple of variants built at run time
            Discriminator(chosen),
            BeforeValidator(exactly_one),
        ]


def tag_of(section: Any, tag: str) -> str:
    """The one value a section's `tag` field takes (`target: Literal["docker"]`): the name
    its plug-in registers under, declared once, in the section."""
    return get_args(section.model_fields[tag].annotation)[0]
