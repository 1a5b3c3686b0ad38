"""Model sources as plug-ins: one module each, registered in `SOURCES` (hf2triton.sources.base).
A spec's `source:` section is the one source whose own key it holds (`repo_id`, `path`,
`package`, `mlflow`, `train`), with that source's keys only; the source brings the model to a
checked local directory and names it in the release record. A new source is a new module that
registers itself where it is defined (`@SOURCES.register`), and its name in the import line here.

Example:
    >>> source = spec.source                 # chosen once, from the key the section holds
    >>> source.name, source.lineage_id
    ('package', 'sentence-transformers/all-MiniLM-L6-v2')
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, TypeAdapter

# The plug-in modules, imported so that each registers its source in SOURCES.
from hf2triton.sources import hub, local, mlflow, train  # noqa: F401
from hf2triton.sources.base import SOURCES, FetchResult, Source, inspect_model_dir

# The `source:` section: one variant per registered source, each with only its own keys.
if TYPE_CHECKING:
    # Statically: any registered source (the variants are known at run time only).
    SourceSpec = Source
else:
    SourceSpec = Annotated[
        SOURCES.keyed_union(),
        Field(
            description="where the model comes from: exactly one of repo_id (with revision), "
            "path, package, mlflow or train"
        ),
    ]


def parse_source(data: dict[str, Any]) -> Source:
    """A source section from a mapping (`{"path": "..."}`)."""
    return TypeAdapter(SourceSpec).validate_python(data)


def fetch_model(source: Source, mlflow_uri: str = "") -> FetchResult:
    """The source's model in a checked local directory, with its lineage (`mlflow_uri`: the
    registry an mlflow source without its own tracking_uri reads)."""
    return source.fetch(mlflow_uri)


__all__ = [
    "SOURCES",
    "FetchResult",
    "Source",
    "SourceSpec",
    "fetch_model",
    "inspect_model_dir",
    "parse_source",
]
