"""Report step: what a person reads in the Prefect UI. A markdown release report (lineage, metrics
against gates, variants, image, endpoint), a table of the accuracy comparison, and links to the
MLflow run and model version.
"""

from __future__ import annotations

import json
from typing import Any

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from tasks.common import NO_PREFECT_CACHE


def _key(name: str, suffix: str) -> str:
    # Artifact keys: lower-case letters, digits and dashes.
    return "".join(c if c.isalnum() else "-" for c in f"{name}-{suffix}".lower())


def accuracy_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    thresholds = report["thresholds"]
    rows = []
    for cand in report["candidates"]:
        row: dict[str, Any] = {"variant": cand["name"]}
        for metric, limit in thresholds.items():
            row[metric] = round(cand["metrics"][metric], 6)
            row[f"{metric} gate"] = limit
        for batch, rate in cand.get("throughput", {}).items():
            row[f"sentences/s {batch.replace('_', ' ')}"] = rate
        row["verdict"] = ("ships" if cand["name"] == report.get("chosen") else
                          "passes, slower" if not cand["misses"] else "misses the gate")
        row["worst sentence"] = cand["worst"][0]["text"][:60] if cand["worst"] else ""
        rows.append(row)
    return rows


def publish_gate_failure(release: str, report: dict[str, Any], message: str) -> None:
    """The refusal, in the UI: which metric missed by how much, for every candidate."""
    create_table_artifact(accuracy_rows(report), key=_key(release, "accuracy"),
                          description=f"Accuracy gate of {release}: no candidate passed")
    create_markdown_artifact(
        f"# Release {release}: refused\n\n{message}\n", key=_key(release, "report"),
        description=f"{release}: accuracy gate failed",
    )


def _mlflow_links(uri: str, run_id: str, experiment_id: str | None, model: str,
                  version: str) -> dict[str, str]:
    if not uri.startswith(("http://", "https://")):
        return {}  # a SQLite store has no UI address to link to
    base = uri.rstrip("/")
    run = f"{base}/#/experiments/{experiment_id}/runs/{run_id}" if experiment_id else \
        f"{base}/#/runs/{run_id}"
    return {"run": run, "version": f"{base}/#/models/{model}/versions/{version}"}


def publish_release_report(summary: dict[str, Any], report_path: str,
                           thresholds: dict[str, float], experiment_id: str | None) -> str:
    """Create the run's artifacts; returns the markdown it published."""
    report = json.loads(open(report_path, encoding="utf-8").read())
    name = summary["release"]
    ml = summary["mlflow"]
    create_table_artifact(accuracy_rows(report), key=_key(name, "accuracy"),
                          description=f"Accuracy of {name}'s candidates against PyTorch")
    metric_lines = "\n".join(
        f"| {k} | {summary['metrics'][k]:.6f} | {thresholds[k]} |"
        for k in thresholds if k in summary["metrics"]
    )
    variants = "\n".join(
        f"| {c['name']} | {c['metrics']['min_cosine']:.4f} | {c['metrics']['mean_cosine']:.4f} "
        f"| {c['metrics']['spearman']:.4f} | "
        f"{'ships' if c['name'] == report.get('chosen') else 'misses the gate'} |"
        for c in report["candidates"]
    )
    image = summary.get("image") or {}
    image_line = (f"`{image['reference']}`" if image.get("reference")
                  else image.get("skipped", "not built"))
    src = summary["source"]
    markdown = f"""# Release {name}: MLflow {ml['model_name']} version {ml['version']}

## Lineage
| | |
|---|---|
| source | `{src['id']}` |
| revision | `{src['revision'] or 'local directory'}` |
| content hash | `{src['content_hash']}` |
| shipped variant | {summary['variant']} |
| image | {image_line} |

## Accuracy against PyTorch ({report['sentences']} validation sentences)
| metric | value | gate |
|---|---|---|
{metric_lines}
| served (smoke) min cosine | {summary['metrics']['smoke_min_cosine']:.6f} | {thresholds['min_cosine']} |

## Variants
| variant | min cosine | mean cosine | Spearman | verdict |
|---|---|---|---|---|
{variants}

## Endpoint
- HTTP: `{summary['endpoint']['http']}`
- gRPC: `{summary['endpoint']['grpc']}` (model `{summary['endpoint']['model']}`, version {summary['endpoint']['version']})
- reused steps: {', '.join(summary['reused_steps']) or 'none'}
"""
    create_markdown_artifact(markdown, key=_key(name, "report"),
                             description=f"Release report of {name}")
    for what, link in _mlflow_links(ml["tracking_uri"], ml["run_id"], experiment_id,
                                    ml["model_name"], ml["version"]).items():
        create_link_artifact(link, link_text=f"MLflow {what}", key=_key(name, f"mlflow-{what}"),
                             description=f"MLflow {what} of this release")
    return markdown


report = task(publish_release_report, name="report", task_run_name="report {summary[release]}",
              **NO_PREFECT_CACHE)
