"""Model stores as plug-ins: where the served Triton repository lives. One module each,
registered in `STORES` by `deploy.model_store.kind`; the store is its spec section, an object
with what the targets need (prepare, the URI Triton loads, the server's environment, a model's
directory). A new store is a new module and one line here.

Example:
    >>> store = spec.deploy.model_store      # chosen once, from the spec
    >>> store.triton_uri()                   # None: the local server's own folder
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, TypeAdapter

from hf2triton.stores.base import ModelDir, ModelStore
from hf2triton.util import plugins

# deploy.model_store `kind:` -> the store's class; each store's module registers it.
STORES = plugins.Registry(lambda cls: plugins.tag_of(cls, "kind"), default="local")
from hf2triton.stores import local, s3  # noqa: E402,F401,I001

# The `deploy.model_store` section: one variant per registered store, each with its own keys.
if TYPE_CHECKING:
    # Statically: any registered store (the variants are known at run time only).
    ModelStoreSpec = ModelStore
else:
    ModelStoreSpec = Annotated[
        STORES.union("kind"),
        Field(
            description="where the served repository lives: the local server's directory, or "
            "an S3-compatible bucket Triton loads from"
        ),
    ]


def parse_store(data: dict[str, Any]) -> ModelStore:
    """A store back from its `describe()` (a deployment's state)."""
    return TypeAdapter(ModelStoreSpec).validate_python(data)


def default_store() -> ModelStore:
    return STORES.load(STORES.default)()


__all__ = ["STORES", "ModelDir", "ModelStore", "ModelStoreSpec", "default_store", "parse_store"]
