"""Model stores as plug-ins: where the served Triton repository lives. One module each,
registered in `STORES` (hf2triton.stores.base) by `deploy.model_store.kind`; the store is its
spec section, an object with what the targets need (prepare, the URI Triton loads, the server's
environment, a model's directory). A new store is a new module that registers itself where it is
defined (`@STORES.register`), and its name in the import line here.

Example:
    >>> store = spec.deploy.model_store      # chosen once, from the spec
    >>> store.triton_uri()                   # None: the local server's own folder
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, TypeAdapter

# The plug-in modules, imported so that each registers its store in STORES.
from hf2triton.stores import local, s3  # noqa: F401
from hf2triton.stores.base import STORES, ModelDir, ModelStore

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
