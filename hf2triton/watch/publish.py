"""What the watch shows and says: a Prefect table artifact per release (one key, so the UI's
latest version is the live one) with a link to the MLflow version, and a Prefect event for each
breach that prefect.yaml's automation answers (hf2triton.orchestration.deployments)."""

from __future__ import annotations

from typing import Any

from hf2triton.release.report import artifact_key, mlflow_links
from hf2triton.watch.observe import BREACH_EVENT, Look

COLUMNS = (
    "endpoint",
    "version",
    "request_rate",
    "requests",
    "failure_rate",
    "p50_ms",
    "p99_ms",
    "queue_ms",
    "compute_ms",
)


def table(look: Look) -> list[dict[str, Any]]:
    """One row per endpoint: the served figures, then the probe's smoke figures."""
    rows = []
    for row in look["rows"]:
        shown = {k: row.get(k) for k in COLUMNS}
        shown.update(
            {
                k: v
                for k, v in row.items()
                if k not in COLUMNS and k not in ("model", "failed", "loaded")
            }
        )
        shown["verdict"] = (
            "breach"
            if any(b.startswith(f"{row['endpoint']} ") for b in look["breaches"])
            else "within budget"
        )
        rows.append(shown)
    return rows


def publish(look: Look, tracking_uri: str) -> str:
    """Create (a new version of) the release's watch table; returns its key."""
    from prefect.artifacts import create_link_artifact, create_table_artifact

    key = artifact_key(look["release"], "watch")
    window = "in the rollback window" if look["in_window"] else "after the rollback window"
    create_table_artifact(
        table(look),
        key=key,
        description=f"Watch of {look['release']}: MLflow {look['model']} champion version "
        f"{look['champion']} ({window}); "
        + ("; ".join(look["breaches"]) if look["breaches"] else "within budget"),
    )
    link = mlflow_links(tracking_uri, "", None, look["model"], look["champion"] or "")
    if link.get("version"):
        create_link_artifact(
            link["version"],
            link_text=f"MLflow {look['model']} version {look['champion']}",
            key=artifact_key(look["release"], "watch-mlflow"),
            description="the watched champion in MLflow",
        )
    return key


def emit_breach(look: Look) -> Any:
    """A Prefect event for the breach; the rollback deployment's trigger matches it when
    `hf2triton.in-window` is true."""
    from prefect.events import emit_event

    return emit_event(
        event=BREACH_EVENT,
        resource={
            "prefect.resource.id": f"hf2triton.release.{look['release']}",
            "hf2triton.model": look["model"],
            "hf2triton.version": str(look["champion"]),
            "hf2triton.in-window": "true" if look["in_window"] else "false",
        },
        payload={"reason": "; ".join(look["breaches"]), "rows": table(look)},
    )
