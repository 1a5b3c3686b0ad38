"""Model stores as plug-ins: where the served Triton repository lives. One module each,
registered in `STORES` by `deploy.model_store.kind`; the store is its spec section, an object
with what the targets need (prepare, the URI Triton loads, the server's environment, a model's
directory). A new store is a new module and one line here.

Example:
    >>> store = spec.deploy.model_store      # chosen once, from the spec
    >>> store.triton_uri()                   # None: the local server's own folder
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Discriminator, Field, Tag, TypeAdapter

from hf2triton import plugins
from hf2triton.stores.base import ModelDir, ModelStore

# deploy.model_store `kind:` -> "module:class" of the store.
STORES: dict[str, str] = {
    "local": "hf2triton.stores.local:LocalStore",
    "s3": "hf2triton.stores.s3:S3Store",
}
DEFAULT = "local"


def _kind_of(value: Any) -> str | None:
    """A section without `kind` is the default store."""
    return value.get("kind", DEFAULT) if isinstance(value, dict) else getattr(value, "kind", None)


# The `deploy.model_store` section: one variant per registered store, each with its own keys.
ModelStoreSpec = Annotated[
    Union[tuple(Annotated[plugins.load(STORES, k), Tag(k)] for k in STORES)],  # noqa: UP007
    Discriminator(_kind_of),
    Field(description="where the served repository lives: the local server's directory, or "
          "an S3-compatible bucket Triton loads from"),
]


def parse_store(data: dict[str, Any]) -> ModelStore:
    """A store back from its `describe()` (a deployment's state)."""
    return TypeAdapter(ModelStoreSpec).validate_python(data)


def default_store() -> ModelStore:
    return plugins.load(STORES, DEFAULT)()


__all__ = ["STORES", "ModelDir", "ModelStore", "ModelStoreSpec", "default_store", "parse_store"]
