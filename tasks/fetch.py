"""Step `fetch`: the model source as a checked local directory, its revision pinned and its
defining files hashed (hf2triton.sources)."""

from __future__ import annotations

from prefect import task

from hf2triton.clients.mlflow import tracking_uri
from hf2triton.sources import FetchResult, Source, fetch_model
from hf2triton.util.runs import NO_PREFECT_CACHE, RETRY_TRANSIENT, step_logger


@task(
    name="fetch", task_run_name="fetch {source.lineage_id}", **RETRY_TRANSIENT, **NO_PREFECT_CACHE
)
def fetch(source: Source) -> FetchResult:
    """Resolve `source` (hub id at a revision, directory, package, or MLflow registry version)
    and hash its files."""
    found = fetch_model(source, tracking_uri())
    step_logger().info(
        "fetch: %s at %s, content %s",
        found["source_id"],
        found["revision"] or "local",
        found["content_hash"][:12],
    )
    return found
